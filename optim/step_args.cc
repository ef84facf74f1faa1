// SPDX-License-Identifier: Apache-2.0
#include "optim/step_args.h"

#include <cmath>

#include "optim/optimizer.h"

namespace psched::optim {

template <typename T>
SgdArgs<T> sgd_args(const OptimizerSpec& spec) {
  return {static_cast<T>(spec.lr), static_cast<T>(spec.weight_decay)};
}

template <typename T>
MomentumArgs<T> momentum_args(const OptimizerSpec& spec, uint64_t t) {
  return {static_cast<T>(spec.lr),
          static_cast<T>(spec.weight_decay),
          static_cast<T>(spec.momentum),
          static_cast<T>(1 - spec.dampening),
          spec.nesterov,
          t == 1};
}

namespace {

// The count of updates v has seen: t, or the update it froze after.
uint64_t variance_updates(uint64_t t, uint64_t frozen_after) {
  return frozen_after == 0 ? t : frozen_after;
}

}  // namespace

template <typename T>
AdamArgs<T> adam_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after) {
  const bool decoupled = spec.kind == OptimizerKind::adamw;
  const double bias_correction1 = 1 - std::pow(spec.beta1, static_cast<double>(t));
  const double bias_correction2 =
      1 - std::pow(spec.beta2, static_cast<double>(variance_updates(t, frozen_after)));
  return {static_cast<T>(spec.beta1),
          static_cast<T>(1 - spec.beta1),
          static_cast<T>(spec.beta2),
          static_cast<T>(1 - spec.beta2),
          static_cast<T>(spec.lr / bias_correction1),
          static_cast<T>(std::sqrt(bias_correction2)),
          static_cast<T>(spec.eps),
          static_cast<T>(decoupled ? 0.0 : spec.weight_decay),
          static_cast<T>(decoupled ? 1 - spec.lr * spec.weight_decay : 1.0),
          spec.amsgrad,
          frozen_after != 0};
}

template <typename T>
AdamTfArgs<T> adam_tf_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after) {
  const double beta1_power = std::pow(spec.beta1, static_cast<double>(t));
  const double beta2_power =
      std::pow(spec.beta2, static_cast<double>(variance_updates(t, frozen_after)));
  return {static_cast<T>(spec.beta1),
          static_cast<T>(1 - spec.beta1),
          static_cast<T>(spec.beta2),
          static_cast<T>(1 - spec.beta2),
          static_cast<T>(spec.lr * std::sqrt(1 - beta2_power) / (1 - beta1_power)),
          static_cast<T>(spec.eps),
          frozen_after != 0};
}

template <typename T>
AdagradArgs<T> adagrad_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after) {
  return {static_cast<T>(spec.lr / (1 + static_cast<double>(t - 1) * spec.lr_decay)),
          static_cast<T>(spec.weight_decay), static_cast<T>(spec.eps), frozen_after != 0};
}

template <typename T>
RmspropArgs<T> rmsprop_args(const OptimizerSpec& spec, uint64_t frozen_after) {
  const bool with_momentum = spec.momentum > 0;
  return {static_cast<T>(spec.lr),
          static_cast<T>(spec.alpha),
          static_cast<T>(1 - spec.alpha),
          static_cast<T>(spec.eps),
          static_cast<T>(spec.weight_decay),
          static_cast<T>(spec.momentum),
          with_momentum ? 1 : -1,
          spec.centered ? (with_momentum ? 2 : 1) : -1,
          frozen_after != 0};
}

#define PSCHED_INSTANTIATE(T)                                                        \
  template SgdArgs<T> sgd_args<T>(const OptimizerSpec&);                             \
  template MomentumArgs<T> momentum_args<T>(const OptimizerSpec&, uint64_t);         \
  template AdamArgs<T> adam_args<T>(const OptimizerSpec&, uint64_t, uint64_t);       \
  template AdamTfArgs<T> adam_tf_args<T>(const OptimizerSpec&, uint64_t, uint64_t);  \
  template AdagradArgs<T> adagrad_args<T>(const OptimizerSpec&, uint64_t, uint64_t); \
  template RmspropArgs<T> rmsprop_args<T>(const OptimizerSpec&, uint64_t);
PSCHED_INSTANTIATE(float)
PSCHED_INSTANTIATE(double)
#undef PSCHED_INSTANTIATE

}  // namespace psched::optim
