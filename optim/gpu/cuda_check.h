// SPDX-License-Identifier: Apache-2.0
// Internal to optim/gpu (CUDA builds only): turning CUDA runtime errors into psched::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "common/error.h"

namespace psched::optim::gpu {

// Throws Error(code) "CUDA error while <what>: <cuda error name> (<its description>)" unless
// `status` is cudaSuccess. Out-of-memory errors are `overloaded` (the device is full, retrying
// elsewhere may work), all others `internal`.
template <typename... Args>
void check_cuda(cudaError_t status, fmt::format_string<Args...> what, Args&&... args) {
  if (status == cudaSuccess) return;
  const ErrorCode code =
      status == cudaErrorMemoryAllocation ? ErrorCode::overloaded : ErrorCode::internal;
  fail(code, "CUDA error while {}: {} ({})", fmt::format(what, std::forward<Args>(args)...),
       cudaGetErrorName(status), cudaGetErrorString(status));
}

}  // namespace psched::optim::gpu
