// SPDX-License-Identifier: Apache-2.0
#include "optim/optimizer.h"

#include <array>
#include <utility>

#include "common/check.h"
#include "optim/kernels.h"

namespace psched::optim {
namespace {

constexpr std::array<std::pair<OptimizerKind, std::string_view>, 7> kNames{{
    {OptimizerKind::sgd, "sgd"},
    {OptimizerKind::momentum, "momentum"},
    {OptimizerKind::adam, "adam"},
    {OptimizerKind::adam_tf, "adam_tf"},
    {OptimizerKind::adamw, "adamw"},
    {OptimizerKind::adagrad, "adagrad"},
    {OptimizerKind::rmsprop, "rmsprop"},
}};

template <typename T>
void check_sizes(const OptimizerSpec& spec, const detail::Range<T>& range, uint64_t t,
                 uint64_t frozen_after) {
  const size_t size = range.param.size();
  const size_t slots = static_cast<size_t>(state_slots(spec));
  PSCHED_REQUIRE(range.grad.size() == size, range.grad.size(), size);
  PSCHED_REQUIRE(range.state.size() == slots, range.state.size(), slots, to_string(spec.kind));
  for (size_t k = 0; k < slots; ++k)
    PSCHED_REQUIRE(range.state[k].size() == size, k, range.state[k].size(), size);
  PSCHED_REQUIRE(t >= 1, t);
  PSCHED_REQUIRE(frozen_after < t, frozen_after, t);
}

template <typename T>
void apply_any(const OptimizerSpec& spec, const detail::Range<T>& range, uint64_t t,
               uint64_t frozen_after) {
  check_sizes(spec, range, t, frozen_after);
  switch (spec.kind) {
    case OptimizerKind::sgd:
      return detail::apply_sgd(spec, range);
    case OptimizerKind::momentum:
      return detail::apply_momentum(spec, range, t);
    case OptimizerKind::adam:
      return detail::apply_adam(spec, range, t, frozen_after);
    case OptimizerKind::adam_tf:
      return detail::apply_adam_tf(spec, range, t, frozen_after);
    case OptimizerKind::adamw:
      return detail::apply_adamw(spec, range, t, frozen_after);
    case OptimizerKind::adagrad:
      return detail::apply_adagrad(spec, range, t, frozen_after);
    case OptimizerKind::rmsprop:
      return detail::apply_rmsprop(spec, range, frozen_after);
  }
  PSCHED_REQUIRE(false, static_cast<int>(spec.kind));
}

}  // namespace

std::string_view to_string(OptimizerKind kind) {
  for (auto& [k, name] : kNames)
    if (k == kind) return name;
  return "unknown";
}

bool parse_optimizer_kind(std::string_view name, OptimizerKind& out) {
  for (auto& [k, n] : kNames) {
    if (n == name) {
      out = k;
      return true;
    }
  }
  return false;
}

OptimizerSpec torch_defaults(OptimizerKind kind) {
  OptimizerSpec spec{.kind = kind};
  switch (kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adam_tf:
      spec.lr = 1e-3;
      break;
    case OptimizerKind::adamw:
      spec.lr = 1e-3;
      spec.weight_decay = 1e-2;
      break;
    case OptimizerKind::adagrad:
      spec.eps = 1e-10;
      break;
    case OptimizerKind::sgd:
    case OptimizerKind::momentum:
    case OptimizerKind::rmsprop:
      break;
  }
  return spec;
}

int state_slots(const OptimizerSpec& spec) {
  switch (spec.kind) {
    case OptimizerKind::sgd:
      return 0;
    case OptimizerKind::momentum:
      return 1;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return spec.amsgrad ? 3 : 2;
    case OptimizerKind::adam_tf:
      return 2;
    case OptimizerKind::adagrad:
      return 1;
    case OptimizerKind::rmsprop:
      return 1 + (spec.momentum > 0 ? 1 : 0) + (spec.centered ? 1 : 0);
  }
  return 0;
}

double initial_state_value(const OptimizerSpec& spec, int slot) {
  PSCHED_REQUIRE(slot >= 0 && slot < state_slots(spec), slot, state_slots(spec));
  return spec.kind == OptimizerKind::adagrad ? spec.initial_accumulator_value : 0.0;
}

void apply(const OptimizerSpec& spec, std::span<float> param, std::span<const float> grad,
           std::span<const std::span<float>> state, uint64_t t, uint64_t variance_frozen_after) {
  apply_any(spec, detail::Range<float>{param, grad, state}, t, variance_frozen_after);
}

void apply(const OptimizerSpec& spec, std::span<double> param, std::span<const double> grad,
           std::span<const std::span<double>> state, uint64_t t, uint64_t variance_frozen_after) {
  apply_any(spec, detail::Range<double>{param, grad, state}, t, variance_frozen_after);
}

}  // namespace psched::optim
