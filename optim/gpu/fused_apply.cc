#include "optim/gpu/fused_apply.h"

#include <cmath>

#include "common/check.h"
#include "optim/gpu/cuda_check.h"

namespace psched::optim::gpu {
namespace {

// The per-step scalars of optim/sgd.cc, adam.cc, adagrad.cc and rmsprop.cc, the same
// expressions in double (this file is built with -ffp-contract=off, as they are).

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

template <typename T>
AdamArgs<T> adam_args(const OptimizerSpec& spec, uint64_t t, double weight_decay, double decay) {
  const double bias_correction1 = 1 - std::pow(spec.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(spec.beta2, static_cast<double>(t));
  return {static_cast<T>(spec.beta1),
          static_cast<T>(1 - spec.beta1),
          static_cast<T>(spec.beta2),
          static_cast<T>(1 - spec.beta2),
          static_cast<T>(spec.lr / bias_correction1),
          static_cast<T>(std::sqrt(bias_correction2)),
          static_cast<T>(spec.eps),
          static_cast<T>(weight_decay),
          static_cast<T>(decay),
          spec.amsgrad};
}

template <typename T>
AdamTfArgs<T> adam_tf_args(const OptimizerSpec& spec, uint64_t t) {
  const double beta1_power = std::pow(spec.beta1, static_cast<double>(t));
  const double beta2_power = std::pow(spec.beta2, static_cast<double>(t));
  return {static_cast<T>(spec.beta1),
          static_cast<T>(1 - spec.beta1),
          static_cast<T>(spec.beta2),
          static_cast<T>(1 - spec.beta2),
          static_cast<T>(spec.lr * std::sqrt(1 - beta2_power) / (1 - beta1_power)),
          static_cast<T>(spec.eps)};
}

template <typename T>
AdagradArgs<T> adagrad_args(const OptimizerSpec& spec, uint64_t t) {
  return {static_cast<T>(spec.lr / (1 + static_cast<double>(t - 1) * spec.lr_decay)),
          static_cast<T>(spec.weight_decay), static_cast<T>(spec.eps)};
}

template <typename T>
RmspropArgs<T> rmsprop_args(const OptimizerSpec& spec) {
  const bool with_momentum = spec.momentum > 0;
  return {static_cast<T>(spec.lr),
          static_cast<T>(spec.alpha),
          static_cast<T>(1 - spec.alpha),
          static_cast<T>(spec.eps),
          static_cast<T>(spec.weight_decay),
          static_cast<T>(spec.momentum),
          with_momentum ? 1 : -1,
          spec.centered ? (with_momentum ? 2 : 1) : -1};
}

template <typename T>
void launch(const OptimizerSpec& spec, const DeviceRange<T>& range, uint64_t t, Stream stream) {
  switch (spec.kind) {
    case OptimizerKind::sgd:
      return launch_sgd(range, sgd_args<T>(spec), stream);
    case OptimizerKind::momentum:  // torch: momentum 0 is plain sgd, the buffer left alone
      if (spec.momentum == 0) return launch_sgd(range, sgd_args<T>(spec), stream);
      return launch_momentum(range, momentum_args<T>(spec, t), stream);
    case OptimizerKind::adam:
      return launch_adam(range, adam_args<T>(spec, t, spec.weight_decay, 1.0), stream);
    case OptimizerKind::adamw:
      return launch_adam(range, adam_args<T>(spec, t, 0.0, 1 - spec.lr * spec.weight_decay),
                         stream);
    case OptimizerKind::adam_tf:
      return launch_adam_tf(range, adam_tf_args<T>(spec, t), stream);
    case OptimizerKind::adagrad:
      return launch_adagrad(range, adagrad_args<T>(spec, t), stream);
    case OptimizerKind::rmsprop:
      return launch_rmsprop(range, rmsprop_args<T>(spec), stream);
  }
  PSCHED_REQUIRE(false, static_cast<int>(spec.kind));
}

}  // namespace

template <typename T>
void enqueue_apply(const OptimizerSpec& spec, const DeviceRange<T>& range, uint64_t t,
                   Stream stream) {
  PSCHED_REQUIRE(t >= 1 && range.size > 0, t, range.size);
  launch(spec, range, t, stream);
  check_cuda(cudaGetLastError(), "launching the {} kernel", to_string(spec.kind));
}

template void enqueue_apply<float>(const OptimizerSpec&, const DeviceRange<float>&, uint64_t,
                                   Stream);
template void enqueue_apply<double>(const OptimizerSpec&, const DeviceRange<double>&, uint64_t,
                                    Stream);

}  // namespace psched::optim::gpu
