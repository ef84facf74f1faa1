// SPDX-License-Identifier: Apache-2.0
// Internal to optim/gpu: the arguments of the fused CUDA kernels, plain structs shared by the
// host code that fills them (fused_apply.cc, built by the C++ compiler) and the kernels
// (fused_kernels.cu, built by nvcc). The per-step scalars (SgdArgs, AdamArgs, ...) are the CPU
// kernels' own, from optim/step_args.h.
#pragma once

#include <cstdint>

#include "optim/step_args.h"

namespace psched::optim::gpu {

// Device pointers to one contiguous piece of a variable. Views; owns nothing.
template <typename T>
struct DeviceRange {
  T* param;
  const T* grad;
  T* state[3];    // the first state_slots(spec) are set, in optimizer.h's slot order
  uint64_t size;  // elements
};

}  // namespace psched::optim::gpu
