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
  std::vector<T> row{T(0.5), T(-1.25), T(2.0)};
  std::vector<T> state(row_state_elements(spec, 3), T(initial_row_state(spec)));
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<T> g(kGrads[t - 1].begin(), kGrads[t - 1].end());
    apply_row(spec, row_step(spec, t), std::span(row), std::span<const T>(g), std::span(state));
  }
  return row;
}

void check_row(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-15));
  }
}

}  // namespace

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
