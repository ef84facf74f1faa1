// SPDX-License-Identifier: Apache-2.0
// Test-only: every optimizer option combination the tests sweep, and a harness that runs
// apply() and the scalar reference (scalar_reference.h) side by side on random data.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include "optim/optimizer.h"
#include "optim/scalar_reference.h"

namespace psched::optim::testing {

// Hyper-parameters are larger than the defaults where that makes each term visible.
namespace specs {
inline OptimizerSpec sgd() {
  return {.kind = OptimizerKind::sgd, .lr = 0.1};
}
inline OptimizerSpec sgd_weight_decay() {
  return {.kind = OptimizerKind::sgd, .lr = 0.1, .weight_decay = 0.01};
}
inline OptimizerSpec momentum() {
  return {.kind = OptimizerKind::momentum, .lr = 0.1, .momentum = 0.9};
}
inline OptimizerSpec momentum_dampening() {
  return {.kind = OptimizerKind::momentum, .lr = 0.1, .momentum = 0.9, .dampening = 0.3};
}
inline OptimizerSpec nesterov() {
  return {.kind = OptimizerKind::momentum, .lr = 0.1, .momentum = 0.9, .nesterov = true};
}
inline OptimizerSpec momentum_weight_decay() {
  return {.kind = OptimizerKind::momentum,
          .lr = 0.1,
          .momentum = 0.9,
          .dampening = 0.1,
          .weight_decay = 0.01};
}
inline OptimizerSpec nesterov_weight_decay() {
  OptimizerSpec spec = nesterov();
  spec.weight_decay = 0.01;
  return spec;
}
// torch.optim.SGD(momentum=0, dampening=0.5) is plain SGD: dampening is never read.
inline OptimizerSpec momentum_zero() {
  return {.kind = OptimizerKind::momentum, .lr = 0.1, .momentum = 0, .dampening = 0.5};
}
inline OptimizerSpec adam() {
  return {.kind = OptimizerKind::adam, .lr = 0.01};
}
inline OptimizerSpec adam_amsgrad() {
  return {.kind = OptimizerKind::adam, .lr = 0.01, .amsgrad = true};
}
inline OptimizerSpec adam_weight_decay() {
  return {.kind = OptimizerKind::adam, .lr = 0.01, .weight_decay = 0.01};
}
inline OptimizerSpec adam_amsgrad_weight_decay() {
  return {.kind = OptimizerKind::adam, .lr = 0.01, .weight_decay = 0.01, .amsgrad = true};
}
inline OptimizerSpec adamw() {
  return {.kind = OptimizerKind::adamw, .lr = 0.01, .weight_decay = 0.01};
}
inline OptimizerSpec adamw_amsgrad() {
  return {.kind = OptimizerKind::adamw, .lr = 0.01, .weight_decay = 0.01, .amsgrad = true};
}
// weight_decay is set to show that adam_tf ignores it.
inline OptimizerSpec adam_tf() {
  return {.kind = OptimizerKind::adam_tf, .lr = 0.01, .weight_decay = 0.5};
}
inline OptimizerSpec adagrad() {
  return {.kind = OptimizerKind::adagrad, .lr = 0.1, .eps = 1e-10};
}
inline OptimizerSpec adagrad_decay() {
  return {.kind = OptimizerKind::adagrad,
          .lr = 0.1,
          .eps = 1e-10,
          .weight_decay = 0.01,
          .lr_decay = 0.1,
          .initial_accumulator_value = 0.1};
}
inline OptimizerSpec rmsprop() {
  return {.kind = OptimizerKind::rmsprop, .lr = 0.01};
}
inline OptimizerSpec rmsprop_weight_decay() {
  return {.kind = OptimizerKind::rmsprop, .lr = 0.01, .weight_decay = 0.01};
}
inline OptimizerSpec rmsprop_centered() {
  return {.kind = OptimizerKind::rmsprop, .lr = 0.01, .centered = true};
}
inline OptimizerSpec rmsprop_momentum() {
  return {.kind = OptimizerKind::rmsprop, .lr = 0.01, .momentum = 0.9};
}
inline OptimizerSpec rmsprop_centered_momentum() {
  return {.kind = OptimizerKind::rmsprop, .lr = 0.01, .momentum = 0.9, .centered = true};
}
}  // namespace specs

struct NamedSpec {
  std::string_view name;
  OptimizerSpec spec;
};

// Every option combination above, for the tests that sweep them all.
inline std::vector<NamedSpec> all_option_combinations() {
  using namespace specs;
  return {{"sgd", sgd()},
          {"sgd_weight_decay", sgd_weight_decay()},
          {"momentum", momentum()},
          {"momentum_dampening", momentum_dampening()},
          {"nesterov", nesterov()},
          {"momentum_weight_decay", momentum_weight_decay()},
          {"nesterov_weight_decay", nesterov_weight_decay()},
          {"momentum_zero", momentum_zero()},
          {"adam", adam()},
          {"adam_amsgrad", adam_amsgrad()},
          {"adam_weight_decay", adam_weight_decay()},
          {"adam_amsgrad_weight_decay", adam_amsgrad_weight_decay()},
          {"adamw", adamw()},
          {"adamw_amsgrad", adamw_amsgrad()},
          {"adam_tf", adam_tf()},
          {"adagrad", adagrad()},
          {"adagrad_decay", adagrad_decay()},
          {"rmsprop", rmsprop()},
          {"rmsprop_weight_decay", rmsprop_weight_decay()},
          {"rmsprop_centered", rmsprop_centered()},
          {"rmsprop_momentum", rmsprop_momentum()},
          {"rmsprop_centered_momentum", rmsprop_centered_momentum()}};
}

// Sizes that leave a remainder for every vector width; 100003 is larger than the caches' lines
// and pages by far.
inline constexpr std::array<size_t, 4> kOddSizes{1, 7, 1023, 100003};

// Gradient scale at steps 1..5: the shrinking steps make v fall, so amsgrad's max matters.
inline constexpr std::array<double, 5> kGradScales{1.0, 0.1, 3.0, 0.5, 2.0};

// `size` values drawn from N(0, scale^2), rounded to T.
template <typename T>
std::vector<T> random_values(std::mt19937& rng, size_t size, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<T> values(size);
  for (T& v : values) v = static_cast<T>(normal(rng));
  return values;
}

// A variable and its state as a shard keeps it (one array per slot), updated by apply().
template <typename T>
struct KernelVariable {
  std::vector<T> param;
  std::vector<std::vector<T>> state;

  KernelVariable(const OptimizerSpec& spec, std::vector<T> initial) : param(std::move(initial)) {
    for (int k = 0; k < state_slots(spec); ++k)
      state.emplace_back(param.size(), static_cast<T>(initial_state_value(spec, k)));
  }
  void step(const OptimizerSpec& spec, std::span<const T> grad, uint64_t t,
            uint64_t frozen_after = 0) {
    std::vector<std::span<T>> views(state.begin(), state.end());
    apply(spec, std::span<T>(param), grad, views, t, frozen_after);
  }
};

// The same variable updated element by element by the scalar reference, in arithmetic R.
template <typename R>
struct ReferenceVariable {
  std::vector<Element<R>> elements;

  template <typename T>
  ReferenceVariable(const OptimizerSpec& spec, const std::vector<T>& initial) {
    for (T p : initial) elements.push_back(reference_initial_element(spec, static_cast<R>(p)));
  }
  template <typename T>
  void step(const OptimizerSpec& spec, std::span<const T> grad, uint64_t t, uint64_t frozen_after) {
    for (size_t i = 0; i < elements.size(); ++i)
      reference_step(spec, elements[i], static_cast<R>(grad[i]), t, frozen_after);
  }
};

// |actual - expected| <= max(relative * max(|actual|, |expected|), absolute_floor).
struct Tolerance {
  double relative;
  double absolute_floor;
};

// Tolerance rules.
// - Kernel against the reference in the kernel's own arithmetic: the kernel does the same
//   operations in the same order, and with EIGEN_FAST_MATH=0 every one (including sqrt) is
//   correctly rounded, so the two agree to a few rounding errors (in practice exactly; with
//   Eigen's fast float sqrt, rmsprop with momentum drifts past 1e-6).
//   double: 1e-12 relative (thousands of ulps of slack). float: 1e-6 relative (about 8 ulps)
//   with a 1e-7 floor (1 ulp at 1; the values are O(1), and relative error means nothing for
//   the odd element that lands near 0).
// - float kernel against the double reference: bounds the float rounding itself (about 6e-8
//   per operation, a few dozen operations over 5 steps, amplified by the divisions), so a
//   float path that drifts from the formula (a scalar cast wrong) still fails: 1e-4 relative,
//   floor 1e-5.
template <typename T>
constexpr Tolerance same_arithmetic_tolerance() {
  if constexpr (std::is_same_v<T, float>) return {1e-6, 1e-7};
  return {1e-12, 1e-15};
}
inline constexpr Tolerance kFloatAgainstDouble{1e-4, 1e-5};
// - The same with the variance frozen after step 2 (kFreezeAfter): steps 3 and 5 bring
//   gradients 30 and 20 times step 2's against a variance of steps 1-2, so rmsprop's momentum
//   buffer sums terms g/avg of about 30 that cancel to about 0.1: float's rounding of the terms
//   (about 2e-6 each) is then 2e-5 absolute on the sum: floor 1e-4.
inline constexpr Tolerance kFloatAgainstDoubleFrozen{1e-4, 1e-4};

// Checks every element of `actual` against `expected_at(i)` under `tol`, reporting the worst.
template <typename T, typename Expected>
void check_close(std::string_view what, const std::vector<T>& actual, const Expected& expected_at,
                 Tolerance tol) {
  size_t worst = 0;
  double worst_excess = -1;  // error / allowed error; > 1 fails
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected_at(i);
    const double allowed =
        std::max(tol.relative * std::max(std::abs(a), std::abs(e)), tol.absolute_floor);
    const double excess = std::isnan(a) || std::isnan(e) ? 1e300 : std::abs(a - e) / allowed;
    if (excess > worst_excess) worst = i, worst_excess = excess;
  }
  if (actual.empty()) return;
  const double worst_actual = actual[worst], worst_expected = expected_at(worst);
  CAPTURE(what);
  CAPTURE(worst);
  CAPTURE(worst_actual);
  CAPTURE(worst_expected);
  CHECK(worst_excess <= 1.0);
}

// Compares the kernel's param and state with a reference variable's.
template <typename T, typename R>
void check_variable(const KernelVariable<T>& kernel, const ReferenceVariable<R>& ref,
                    Tolerance tol) {
  check_close(
      "param", kernel.param, [&](size_t i) { return double(ref.elements[i].p); }, tol);
  for (size_t k = 0; k < kernel.state.size(); ++k) {
    CAPTURE(k);
    check_close(
        "state", kernel.state[k], [&](size_t i) { return double(ref.elements[i].s[k]); }, tol);
  }
}

// The second moment is frozen after this step in the frozen runs (optimizer.h's apply).
inline constexpr uint64_t kFreezeAfter = 2;

// The variance frozen at step `t` of a run that freezes after `freeze_after` (0: never).
inline uint64_t frozen_at(uint64_t t, uint64_t freeze_after) {
  return freeze_after != 0 && t > freeze_after ? freeze_after : 0;
}

// Runs 5 steps of apply() on `size` random elements of type T and compares, after each step,
// param and state with the scalar reference (in T, and for float also in double). With
// `freeze_after`, the steps after it are applied with the variance frozen.
template <typename T>
void check_against_reference(const OptimizerSpec& spec, size_t size, uint32_t seed,
                             uint64_t freeze_after) {
  std::mt19937 rng(seed);
  const std::vector<T> initial = random_values<T>(rng, size, 1.0);
  KernelVariable<T> kernel(spec, initial);
  ReferenceVariable<T> same(spec, initial);
  ReferenceVariable<double> exact(spec, initial);
  REQUIRE(state_slots(spec) == reference_slot_count(spec));
  for (uint64_t t = 1; t <= kGradScales.size(); ++t) {
    CAPTURE(t);
    const std::vector<T> grad = random_values<T>(rng, size, kGradScales[t - 1]);
    const uint64_t frozen = frozen_at(t, freeze_after);
    kernel.step(spec, grad, t, frozen);
    same.step(spec, std::span<const T>(grad), t, frozen);
    check_variable(kernel, same, same_arithmetic_tolerance<T>());
    if constexpr (std::is_same_v<T, float>) {
      exact.step(spec, std::span<const T>(grad), t, frozen);
      check_variable(kernel, exact,
                     freeze_after == 0 ? kFloatAgainstDouble : kFloatAgainstDoubleFrozen);
    }
  }
}

// check_against_reference on every size of kOddSizes, with the variance updated at every step
// and frozen after kFreezeAfter.
template <typename T>
void check_on_odd_sizes(const OptimizerSpec& spec) {
  for (size_t size : kOddSizes) {
    for (uint64_t freeze_after : {uint64_t(0), kFreezeAfter}) {
      CAPTURE(size);
      CAPTURE(freeze_after);
      check_against_reference<T>(spec, size, /*seed=*/static_cast<uint32_t>(1000 + size),
                                 freeze_after);
    }
  }
}

}  // namespace psched::optim::testing
