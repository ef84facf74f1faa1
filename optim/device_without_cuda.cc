// SPDX-License-Identifier: Apache-2.0
// ComputeDevice in a build without CUDA support (PSCHED_CUDA off or nvcc not found): every
// CUDA device is refused at open.
#include "common/check.h"
#include "common/error.h"
#include "optim/device.h"

namespace psched::optim {

bool built_with_cuda() {
  return false;
}

std::unique_ptr<ComputeDevice> ComputeDevice::open(const DeviceSpec& device, size_t) {
  PSCHED_REQUIRE(device.kind == DeviceSpec::Kind::cuda, to_string(device));
  fail(ErrorCode::bad_config,
       "device {} is not available: this psched build has no CUDA support (rebuild with the "
       "CUDA toolkit installed and -DPSCHED_CUDA=ON; see docs/gpu.md)",
       to_string(device));
}

}  // namespace psched::optim
