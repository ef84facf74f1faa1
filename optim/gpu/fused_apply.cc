// SPDX-License-Identifier: Apache-2.0
#include "optim/gpu/fused_apply.h"

#include "common/check.h"
#include "optim/gpu/cuda_check.h"

namespace psched::optim::gpu {
namespace {

// The per-step scalars are the CPU kernels' (optim/step_args.h).
template <typename T>
void launch(const OptimizerSpec& spec, const DeviceRange<T>& range, uint64_t t,
            uint64_t frozen_after, Stream stream) {
  switch (spec.kind) {
    case OptimizerKind::sgd:
      return launch_sgd(range, sgd_args<T>(spec), stream);
    case OptimizerKind::momentum:  // torch: momentum 0 is plain sgd, the buffer left alone
      if (spec.momentum == 0) return launch_sgd(range, sgd_args<T>(spec), stream);
      return launch_momentum(range, momentum_args<T>(spec, t), stream);
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return launch_adam(range, adam_args<T>(spec, t, frozen_after), stream);
    case OptimizerKind::adam_tf:
      return launch_adam_tf(range, adam_tf_args<T>(spec, t, frozen_after), stream);
    case OptimizerKind::adagrad:
      return launch_adagrad(range, adagrad_args<T>(spec, t, frozen_after), stream);
    case OptimizerKind::rmsprop:
      return launch_rmsprop(range, rmsprop_args<T>(spec, frozen_after), stream);
  }
  PSCHED_REQUIRE(false, static_cast<int>(spec.kind));
}

}  // namespace

template <typename T>
void enqueue_apply(const OptimizerSpec& spec, const DeviceRange<T>& range, uint64_t t,
                   uint64_t variance_frozen_after, Stream stream) {
  PSCHED_REQUIRE(t >= 1 && variance_frozen_after < t && range.size > 0, t, variance_frozen_after,
                 range.size);
  launch(spec, range, t, variance_frozen_after, stream);
  check_cuda(cudaGetLastError(), "launching the {} kernel", to_string(spec.kind));
}

template void enqueue_apply<float>(const OptimizerSpec&, const DeviceRange<float>&, uint64_t,
                                   uint64_t, Stream);
template void enqueue_apply<double>(const OptimizerSpec&, const DeviceRange<double>&, uint64_t,
                                    uint64_t, Stream);

}  // namespace psched::optim::gpu
