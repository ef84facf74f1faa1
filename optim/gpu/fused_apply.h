// SPDX-License-Identifier: Apache-2.0
// Internal to optim/gpu: optim::apply on device memory, as one fused kernel launch.
#pragma once

#include <cstdint>

#include "optim/gpu/fused_kernels.h"
#include "optim/optimizer.h"

namespace psched::optim::gpu {

// Enqueues one update of `range` (device memory on the current CUDA device) on `stream` and
// returns at once: optim::apply's formula for `spec` at step `t` (>= 1), the variance frozen
// after update `variance_frozen_after` (< t; 0: not frozen), with the per-step scalars
// computed in double and cast to T exactly as the CPU kernels compute them.
// `spec` must have passed validate(); `range` holds state_slots(spec) state pointers.
// Throws psched::Error(internal) when the launch fails.
template <typename T>
void enqueue_apply(const OptimizerSpec& spec, const DeviceRange<T>& range, uint64_t t,
                   uint64_t variance_frozen_after, Stream stream);

}  // namespace psched::optim::gpu
