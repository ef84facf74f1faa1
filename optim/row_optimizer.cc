// SPDX-License-Identifier: Apache-2.0
// The row optimizers, element by element in the order of operations of their references (torch's
// sparse paths, FBGEMM's rowwise kernel), so that float64 rows agree with torch to rounding.
#include "optim/row_optimizer.h"

#include <array>
#include <cmath>
#include <utility>

#include "common/check.h"
#include "common/error.h"

// The exported kernels are built three times, for x86-64's baseline (SSE2), AVX2 (x86-64-v3)
// and AVX-512 (x86-64-v4), and the loader picks the widest the CPU runs (GCC's function
// multiversioning, an ifunc). Wider registers run the same IEEE operations on more elements at
// once, each element's in the same order, and -ffp-contract=off (optim/CMakeLists.txt) keeps
// FMA out, so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PSCHED_ROW_KERNEL_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define PSCHED_ROW_KERNEL_INLINE [[gnu::always_inline]] inline
#else
#define PSCHED_ROW_KERNEL_CLONES
#define PSCHED_ROW_KERNEL_INLINE inline
#endif

namespace psched::optim {
namespace {

constexpr std::array<std::pair<RowOptimizerKind, std::string_view>, 4> kNames{{
    {RowOptimizerKind::sgd, "sgd"},
    {RowOptimizerKind::adagrad, "adagrad"},
    {RowOptimizerKind::rowwise_adagrad, "rowwise_adagrad"},
    {RowOptimizerKind::sparse_adam, "sparse_adam"},
}};

[[noreturn]] void reject(const RowOptimizerSpec& spec, std::string_view field, double value,
                         std::string_view what) {
  fail(ErrorCode::invalid_argument, "row optimizer '{}': {} = {} {}", to_string(spec.kind), field,
       value, what);
}

void non_negative(const RowOptimizerSpec& spec, std::string_view field, double value) {
  if (!(std::isfinite(value) && value >= 0)) reject(spec, field, value, "must be finite and >= 0");
}

// The loops below read and write through restrict pointers (a row, its gradient and its state
// never overlap) and are built with -fno-math-errno and -O3 (optim/CMakeLists.txt), so that the
// compiler runs them in SIMD registers: the same IEEE operations element by element, in the
// same order, so the same results as one element at a time.
template <typename T>
PSCHED_ROW_KERNEL_INLINE void sgd(const RowOptimizerSpec& spec, std::span<T> row,
                                  std::span<const T> grad) {
  T* __restrict w = row.data();
  const T* __restrict g = grad.data();
  const T alpha = static_cast<T>(-spec.lr);
  for (size_t i = 0; i < row.size(); ++i) w[i] += alpha * g[i];
}

template <typename T>
PSCHED_ROW_KERNEL_INLINE void adagrad(const RowOptimizerSpec& spec, const RowStep& step,
                                      std::span<T> row, std::span<const T> grad,
                                      std::span<T> sums) {
  T* __restrict w = row.data();
  T* __restrict sum = sums.data();
  const T* __restrict g = grad.data();
  const T alpha = static_cast<T>(-step.lr), eps = static_cast<T>(spec.eps);
  for (size_t i = 0; i < row.size(); ++i) {
    sum[i] += g[i] * g[i];
    w[i] += alpha * (g[i] / (std::sqrt(sum[i]) + eps));
  }
}

// rowwise_adagrad's step once the row's sum of squares is known: the accumulator, then the row.
template <typename T>
PSCHED_ROW_KERNEL_INLINE void rowwise_step(const RowOptimizerSpec& spec, std::span<T> row,
                                           std::span<const T> grad, T& accumulator, T squares) {
  T* __restrict w = row.data();
  const T* __restrict g = grad.data();
  accumulator += squares / static_cast<T>(row.size());
  const T multiplier =
      static_cast<T>(spec.lr) / (std::sqrt(accumulator) + static_cast<T>(spec.eps));
  for (size_t i = 0; i < row.size(); ++i) w[i] -= multiplier * g[i];
}

template <typename T>
PSCHED_ROW_KERNEL_INLINE void rowwise_adagrad(const RowOptimizerSpec& spec, std::span<T> row,
                                              std::span<const T> grad, T& accumulator) {
  const T* __restrict g = grad.data();
  T squares = 0;  // in order (a sum is not reassociated): FBGEMM's float64 result to rounding
  for (size_t i = 0; i < row.size(); ++i) squares += g[i] * g[i];
  rowwise_step(spec, row, grad, accumulator, squares);
}

// rowwise_adagrad on kRowwiseGroup rows (each a table's block: value, then the accumulator):
// their sums of squares side by side, each in its own order, so that one row's additions wait
// on each other but not on another row's.
constexpr size_t kRowwiseGroup = 4;
template <typename T>
PSCHED_ROW_KERNEL_INLINE void rowwise_group(const RowOptimizerSpec& spec, uint64_t dim,
                                            T* const* rows, const T* const* grads) {
  std::array<T, kRowwiseGroup> squares{};
  for (size_t i = 0; i < dim; ++i)
    for (size_t r = 0; r < kRowwiseGroup; ++r) squares[r] += grads[r][i] * grads[r][i];
  for (size_t r = 0; r < kRowwiseGroup; ++r)
    rowwise_step(spec, std::span(rows[r], dim), std::span(grads[r], dim), rows[r][dim], squares[r]);
}

template <typename T>
PSCHED_ROW_KERNEL_INLINE void sparse_adam(const RowOptimizerSpec& spec, const RowStep& step,
                                          std::span<T> row, std::span<const T> grad,
                                          std::span<T> state) {
  const size_t n = row.size();
  T* __restrict w = row.data();
  T* __restrict m = state.data();
  T* __restrict v = state.data() + n;
  const T* __restrict g = grad.data();
  const T step_size = static_cast<T>(step.lr);
  const T keep1 = static_cast<T>(1 - spec.beta1), keep2 = static_cast<T>(1 - spec.beta2);
  const T eps = static_cast<T>(spec.eps);
  for (size_t i = 0; i < n; ++i) {
    const T dm = (g[i] - m[i]) * keep1;
    const T dv = (g[i] * g[i] - v[i]) * keep2;
    const T numer = dm + m[i];
    const T denom = std::sqrt(dv + v[i]) + eps;
    m[i] += dm;
    v[i] += dv;
    w[i] += -step_size * (numer / denom);
  }
}

template <typename T>
PSCHED_ROW_KERNEL_INLINE void apply(const RowOptimizerSpec& spec, const RowStep& step,
                                    std::span<T> row, std::span<const T> grad, std::span<T> state) {
  PSCHED_REQUIRE(grad.size() == row.size(), grad.size(), row.size());
  PSCHED_REQUIRE(state.size() == row_state_elements(spec, row.size()), state.size());
  switch (spec.kind) {
    case RowOptimizerKind::sgd:
      return sgd(spec, row, grad);
    case RowOptimizerKind::adagrad:
      return adagrad(spec, step, row, grad, state);
    case RowOptimizerKind::rowwise_adagrad:
      return rowwise_adagrad(spec, row, grad, state[0]);
    case RowOptimizerKind::sparse_adam:
      return sparse_adam(spec, step, row, grad, state);
  }
}

template <typename T>
PSCHED_ROW_KERNEL_INLINE void apply_each(const RowOptimizerSpec& spec, const RowStep& step,
                                         uint64_t dim, std::span<T* const> rows,
                                         std::span<const T* const> grads) {
  PSCHED_REQUIRE(grads.size() == rows.size(), grads.size(), rows.size());
  size_t k = 0;
  if (spec.kind == RowOptimizerKind::rowwise_adagrad)
    for (; k + kRowwiseGroup <= rows.size(); k += kRowwiseGroup)
      rowwise_group(spec, dim, rows.data() + k, grads.data() + k);
  const uint64_t state = row_state_elements(spec, dim);
  for (; k < rows.size(); ++k)
    apply(spec, step, std::span(rows[k], dim), std::span(grads[k], dim),
          std::span(rows[k] + dim, state));
}

}  // namespace

std::string_view to_string(RowOptimizerKind kind) {
  for (const auto& [k, name] : kNames)
    if (k == kind) return name;
  return "?";
}

bool parse_row_optimizer_kind(std::string_view name, RowOptimizerKind& out) {
  for (const auto& [k, n] : kNames) {
    if (n != name) continue;
    out = k;
    return true;
  }
  return false;
}

RowOptimizerSpec torch_row_defaults(RowOptimizerKind kind) {
  RowOptimizerSpec spec{.kind = kind};
  if (kind == RowOptimizerKind::sparse_adam) spec.lr = 1e-3;
  if (kind == RowOptimizerKind::sparse_adam || kind == RowOptimizerKind::rowwise_adagrad)
    spec.eps = 1e-8;
  return spec;
}

void validate_row(const RowOptimizerSpec& spec) {
  non_negative(spec, "lr", spec.lr);
  non_negative(spec, "eps", spec.eps);
  if (spec.kind == RowOptimizerKind::sparse_adam) {
    if (!(spec.beta1 >= 0 && spec.beta1 < 1))
      reject(spec, "beta1", spec.beta1, "is outside [0, 1)");
    if (!(spec.beta2 >= 0 && spec.beta2 < 1))
      reject(spec, "beta2", spec.beta2, "is outside [0, 1)");
  }
  non_negative(spec, "lr_decay", spec.lr_decay);
  non_negative(spec, "initial_accumulator_value", spec.initial_accumulator_value);
  if (spec.weight_decay != 0)
    reject(spec, "weight_decay", spec.weight_decay,
           "is not supported: it would change rows a step did not touch (torch refuses weight "
           "decay on sparse gradients too)");
  if (spec.momentum != 0)
    reject(spec, "momentum", spec.momentum,
           "is not supported: momentum would go on moving rows a step did not touch");
}

uint64_t row_state_elements(const RowOptimizerSpec& spec, uint64_t dim) {
  switch (spec.kind) {
    case RowOptimizerKind::sgd:
      return 0;
    case RowOptimizerKind::adagrad:
      return dim;
    case RowOptimizerKind::rowwise_adagrad:
      return 1;
    case RowOptimizerKind::sparse_adam:
      return 2 * dim;
  }
  return 0;
}

double initial_row_state(const RowOptimizerSpec& spec) {
  const bool accumulates =
      spec.kind == RowOptimizerKind::adagrad || spec.kind == RowOptimizerKind::rowwise_adagrad;
  return accumulates ? spec.initial_accumulator_value : 0.0;
}

RowStep row_step(const RowOptimizerSpec& spec, uint64_t t) {
  PSCHED_REQUIRE(t >= 1, t);
  switch (spec.kind) {
    case RowOptimizerKind::adagrad:
      return {spec.lr / (1 + double(t - 1) * spec.lr_decay)};
    case RowOptimizerKind::sparse_adam: {
      const double bias1 = 1 - std::pow(spec.beta1, double(t));
      const double bias2 = 1 - std::pow(spec.beta2, double(t));
      return {spec.lr * std::sqrt(bias2) / bias1};
    }
    default:
      return {spec.lr};
  }
}

PSCHED_ROW_KERNEL_CLONES
void apply_rows(const RowOptimizerSpec& spec, const RowStep& step, uint64_t dim,
                std::span<float* const> rows, std::span<const float* const> grads) {
  apply_each(spec, step, dim, rows, grads);
}

PSCHED_ROW_KERNEL_CLONES
void apply_rows(const RowOptimizerSpec& spec, const RowStep& step, uint64_t dim,
                std::span<double* const> rows, std::span<const double* const> grads) {
  apply_each(spec, step, dim, rows, grads);
}

}  // namespace psched::optim
