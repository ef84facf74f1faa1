// SPDX-License-Identifier: Apache-2.0
// Internal to optim/gpu: launches of the fused optimizer kernels (fused_kernels.cu). Each
// kernel reads param, grad and the state slots of an element and writes param and state in
// one pass, with the operations of the CPU kernel in the same order (built without FMA
// contraction and with IEEE division and square root, so each element's result is the CPU's).
// Each call enqueues one kernel on `stream` and returns at once; `range.size` must be > 0.
// Launch errors are left for cudaGetLastError.
#pragma once

#include "optim/gpu/kernel_args.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header needs no CUDA headers

namespace psched::optim::gpu {

using Stream = CUstream_st*;

template <typename T>
void launch_sgd(const DeviceRange<T>& range, const SgdArgs<T>& args, Stream stream);
template <typename T>
void launch_momentum(const DeviceRange<T>& range, const MomentumArgs<T>& args, Stream stream);
template <typename T>
void launch_adam(const DeviceRange<T>& range, const AdamArgs<T>& args, Stream stream);
template <typename T>
void launch_adam_tf(const DeviceRange<T>& range, const AdamTfArgs<T>& args, Stream stream);
template <typename T>
void launch_adagrad(const DeviceRange<T>& range, const AdagradArgs<T>& args, Stream stream);
template <typename T>
void launch_rmsprop(const DeviceRange<T>& range, const RmspropArgs<T>& args, Stream stream);

}  // namespace psched::optim::gpu
