// SPDX-License-Identifier: Apache-2.0
// The row optimizers against their references: three float64 updates of one row, compared with
// what torch 1.13 (Debian's python3-torch) computed for the same row as a sparse gradient of
// an embedding (sgd, adagrad, sparse_adam), and with FBGEMM's EXACT_ROWWISE_ADAGRAD formula
// evaluated in Python for rowwise_adagrad. The literals come from:
//   w = torch.nn.Parameter(torch.tensor([[0.5, -1.25, 2.0]], dtype=torch.float64))
//   each step: w.grad = torch.sparse_coo_tensor([[0]], [g], w.shape); opt.step()
// with the optimizers and gradients of each case below.
#include "optim/row_optimizer.h"

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "common/error_test_support.h"

using namespace psched;
using namespace psched::optim;
using psched::testing::code_of;

namespace {

const std::array<std::vector<double>, 3> kGrads{
    {{0.1, -0.2, 0.3}, {1.5, 0.0, -0.7}, {-0.4, 0.9, 0.05}}};

// The row after three updates (t = 1, 2, 3) of [0.5, -1.25, 2.0] by kGrads under `spec`.
template <typename T>
std::vector<T> three_updates(const RowOptimizerSpec& spec) {
  std::vector<T> block{T(0.5), T(-1.25), T(2.0)};  // the row, then its state
  block.resize(3 + row_state_elements(spec, 3), T(initial_row_state(spec)));
  T* const rows[] = {block.data()};
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<T> g(kGrads[t - 1].begin(), kGrads[t - 1].end());
    const T* const grads[] = {g.data()};
    apply_rows(spec, row_step(spec, t), 3, std::span(rows), std::span(grads));
  }
  block.resize(3);
  return block;
}

void check_row(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-15));
  }
}

// One row's update one element at a time, in the order of operations the kernels promise (their
// references'): what their SIMD loops must give bit for bit.
template <typename T>
void scalar_update(const RowOptimizerSpec& spec, const RowStep& step, std::span<T> w,
                   std::span<const T> g, std::span<T> state) {
  const size_t n = w.size();
  const T lr = static_cast<T>(spec.lr), eps = static_cast<T>(spec.eps);
  if (spec.kind == RowOptimizerKind::sgd)
    for (size_t i = 0; i < n; ++i) w[i] += -lr * g[i];
  if (spec.kind == RowOptimizerKind::adagrad)
    for (size_t i = 0; i < n; ++i) {
      state[i] += g[i] * g[i];
      w[i] += static_cast<T>(-step.lr) * (g[i] / (std::sqrt(state[i]) + eps));
    }
  if (spec.kind == RowOptimizerKind::rowwise_adagrad) {
    T squares = 0;
    for (size_t i = 0; i < n; ++i) squares += g[i] * g[i];
    state[0] += squares / static_cast<T>(n);
    const T multiplier = lr / (std::sqrt(state[0]) + eps);
    for (size_t i = 0; i < n; ++i) w[i] -= multiplier * g[i];
  }
  if (spec.kind == RowOptimizerKind::sparse_adam)
    for (size_t i = 0; i < n; ++i) {
      T &m = state[i], &v = state[n + i];
      const T dm = (g[i] - m) * static_cast<T>(1 - spec.beta1);
      const T dv = (g[i] * g[i] - v) * static_cast<T>(1 - spec.beta2);
      const T numer = dm + m, denom = std::sqrt(dv + v) + eps;
      m += dm;
      v += dv;
      w[i] += -static_cast<T>(step.lr) * (numer / denom);
    }
}

// `rows` blocks of a row of `dim` values then its state, as a table keeps them, drawn from
// `random`: values and gradients in [-1, 1] (a few gradients exactly 0), sums and second
// moments in [0, 1], first moments in [-1, 1].
template <typename T>
std::vector<T> random_blocks(const RowOptimizerSpec& spec, size_t rows, size_t dim,
                             std::mt19937_64& random) {
  std::uniform_real_distribution<T> any(-1, 1), positive(0, 1);
  const size_t state = row_state_elements(spec, dim), block = dim + state;
  std::vector<T> blocks(rows * block);
  for (size_t k = 0; k < blocks.size(); ++k) {
    const size_t at = k % block;
    const bool first_moment = spec.kind == RowOptimizerKind::sparse_adam && at < 2 * dim;
    blocks[k] = at < dim || first_moment ? any(random) : positive(random);
  }
  return blocks;
}

}  // namespace

TEST_CASE_TEMPLATE("the kernels give one element at a time's bits at every width and row count", T,
                   float, double) {
  std::mt19937_64 random(11);
  for (RowOptimizerKind kind : {RowOptimizerKind::sgd, RowOptimizerKind::adagrad,
                                RowOptimizerKind::rowwise_adagrad, RowOptimizerKind::sparse_adam})
    for (size_t dim : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 255, 256, 257}) {
      CAPTURE(to_string(kind));
      CAPTURE(dim);
      const RowOptimizerSpec spec = torch_row_defaults(kind);
      const RowStep step = row_step(spec, 3);
      const size_t rows = 9, block = dim + row_state_elements(spec, dim);  // groups of 4 and 1
      const std::vector<T> grads = random_blocks<T>(spec, rows, dim, random);
      std::vector<T> want = random_blocks<T>(spec, rows, dim, random), one = want, all = want;
      std::vector<T*> pointers;
      std::vector<const T*> gradients;
      for (size_t k = 0; k < rows; ++k) {
        const std::span<const T> g(grads.data() + k * block, dim);
        scalar_update(spec, step, std::span(want.data() + k * block, dim), g,
                      std::span(want.data() + k * block + dim, block - dim));
        T* const alone[] = {one.data() + k * block};  // a call of its own: no group of four
        const T* const its[] = {g.data()};
        apply_rows(spec, step, dim, std::span(alone), std::span(its));
        pointers.push_back(all.data() + k * block);
        gradients.push_back(g.data());
      }
      apply_rows(spec, step, dim, std::span<T* const>(pointers), std::span(gradients));
      CHECK(std::memcmp(one.data(), want.data(), want.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(all.data(), want.data(), want.size() * sizeof(T)) == 0);
    }
}

TEST_CASE("sgd on a row is torch.optim.SGD on the sparse gradient") {
  RowOptimizerSpec spec = torch_row_defaults(RowOptimizerKind::sgd);
  spec.lr = 0.1;
  check_row(three_updates<double>(spec),
            {0.37999999999999995, -1.3200000000000001, 2.0350000000000001});
}

TEST_CASE("adagrad on a row is torch.optim.Adagrad's sparse path, lr decay and start included") {
  RowOptimizerSpec spec = torch_row_defaults(RowOptimizerKind::adagrad);
  spec.lr = 0.1;
  spec.lr_decay = 0.01;
  spec.initial_accumulator_value = 0.05;
  check_row(three_updates<double>(spec),
            {0.38641191635987904, -1.2763414998212923, 2.0009764798741192});
}

TEST_CASE("sparse_adam on a row is torch.optim.SparseAdam, bias correction from the step") {
  RowOptimizerSpec spec = torch_row_defaults(RowOptimizerKind::sparse_adam);
  spec.lr = 0.01;
  spec.beta1 = 0.8;
  spec.beta2 = 0.95;
  check_row(three_updates<double>(spec),
            {0.47790769897939722, -1.2394418198645585, 1.9976742647787238});
}

TEST_CASE("rowwise_adagrad keeps one accumulator a row, FBGEMM's exact rowwise formula") {
  RowOptimizerSpec spec = torch_row_defaults(RowOptimizerKind::rowwise_adagrad);
  spec.lr = 0.1;
  spec.initial_accumulator_value = 0.05;
  CHECK(row_state_elements(spec, 3) == 1);
  check_row(three_updates<double>(spec),
            {0.35321124354874273, -1.2635911900916212, 1.9688337031389587});
}

TEST_CASE("float32 rows follow the same formulas to float32's precision") {
  for (RowOptimizerKind kind : {RowOptimizerKind::sgd, RowOptimizerKind::adagrad,
                                RowOptimizerKind::rowwise_adagrad, RowOptimizerKind::sparse_adam}) {
    CAPTURE(to_string(kind));
    RowOptimizerSpec spec = torch_row_defaults(kind);
    std::vector<float> narrow = three_updates<float>(spec);
    std::vector<double> wide = three_updates<double>(spec);
    for (size_t i = 0; i < 3; ++i) CHECK(narrow[i] == doctest::Approx(wide[i]).epsilon(1e-5));
  }
}

TEST_CASE("what no row optimizer can do is refused, naming the setting") {
  RowOptimizerSpec spec = torch_row_defaults(RowOptimizerKind::adagrad);
  spec.weight_decay = 0.01;
  CHECK(code_of([&] { validate_row(spec); }) == ErrorCode::invalid_argument);
  spec = torch_row_defaults(RowOptimizerKind::sgd);
  spec.momentum = 0.9;
  CHECK(code_of([&] { validate_row(spec); }) == ErrorCode::invalid_argument);
  spec = torch_row_defaults(RowOptimizerKind::sparse_adam);
  spec.beta1 = 1;
  CHECK(code_of([&] { validate_row(spec); }) == ErrorCode::invalid_argument);
  spec.beta1 = 0.9;
  spec.lr = -1;
  CHECK(code_of([&] { validate_row(spec); }) == ErrorCode::invalid_argument);
  for (RowOptimizerKind kind : {RowOptimizerKind::sgd, RowOptimizerKind::adagrad,
                                RowOptimizerKind::rowwise_adagrad, RowOptimizerKind::sparse_adam}) {
    RowOptimizerKind parsed;
    REQUIRE(parse_row_optimizer_kind(to_string(kind), parsed));
    CHECK(parsed == kind);
    validate_row(torch_row_defaults(kind));  // the defaults hold
  }
  RowOptimizerKind unused;
  CHECK_FALSE(parse_row_optimizer_kind("adam", unused));
}
