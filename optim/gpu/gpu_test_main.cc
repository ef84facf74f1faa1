// SPDX-License-Identifier: Apache-2.0
// main() of gpu_test: runs the doctest cases where CUDA device 0 can be opened; elsewhere it
// says why and exits kSkipped, which ctest reports as skipped (SKIP_RETURN_CODE).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "common/error.h"
#include "optim/device.h"

namespace {

constexpr int kSkipped = 77;  // SKIP_RETURN_CODE in actors/CMakeLists.txt

}  // namespace

int main(int argc, char** argv) {
  try {
    psched::optim::ComputeDevice::open({psched::optim::DeviceSpec::Kind::cuda, 0});
  } catch (const psched::Error& e) {
    std::printf("gpu_test skipped: no GPU: %s\n", e.what());
    return kSkipped;
  }
  return doctest::Context(argc, argv).run();
}
