// SPDX-License-Identifier: Apache-2.0
// DeviceSpec's text form and ComputeDevice::open's refusals; these run on every machine. The
// CUDA kernels themselves are checked by gpu/gpu_optim_test.cc where a GPU is present.
#include "optim/device.h"

#include <doctest/doctest.h>

#include <string>

#include "common/error.h"

namespace psched::optim {
namespace {

using Kind = DeviceSpec::Kind;

TEST_CASE("devices parse from cpu and cuda:N and print back the same") {
  for (std::string text : {"cpu", "cuda:0", "cuda:7", "cuda:12"}) {
    DeviceSpec device{Kind::cuda, 99};
    REQUIRE(parse_device(text, device));
    CHECK(to_string(device) == text);
  }
  DeviceSpec device;
  REQUIRE(parse_device("cuda:3", device));
  CHECK(device == DeviceSpec{Kind::cuda, 3});
}

TEST_CASE("anything but cpu or cuda:N is no device") {
  for (std::string text : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:1x", "cuda: 1", "CPU",
                           "cuda:99999999999", "cpu:0"}) {
    CAPTURE(text);
    DeviceSpec device;
    CHECK_FALSE(parse_device(text, device));
  }
}

TEST_CASE("opening a CUDA device that is not there fails with bad_config naming the device") {
  // No machine has 1000 GPUs; without CUDA support or without a GPU every device is refused.
  std::string message;
  try {
    ComputeDevice::open(DeviceSpec{Kind::cuda, 1000});
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.starts_with("device cuda:1000 is not available: "));
  if (!built_with_cuda()) CHECK(message.find("no CUDA support") != std::string::npos);
}

}  // namespace
}  // namespace psched::optim
