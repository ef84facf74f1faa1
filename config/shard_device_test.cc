// SPDX-License-Identifier: Apache-2.0
// The shards' `device` key: cpu by default, cuda:N for a GPU, anything else named with its line.
#include <string>

#include <doctest/doctest.h>

#include "common/error.h"
#include "config/deployment.h"

namespace psched {
namespace {

using Kind = optim::DeviceSpec::Kind;

DeploymentConfig parse(const std::string& yaml) {
  return parse_deployment(yaml, "configs/x.yaml");
}

TEST_CASE("a shard keeps its variables on the cpu unless its device says otherwise") {
  DeploymentConfig config = parse(
      "shards:\n"
      "  - listen: 127.0.0.1:7000\n"
      "  - listen: 127.0.0.1:7001\n"
      "    device: cuda:1\n"
      "  - listen: 127.0.0.1:7002\n"
      "    device: cpu\n");
  REQUIRE(config.shards.size() == 3);
  CHECK(config.shards[0].device == optim::DeviceSpec{});
  CHECK(config.shards[1].device == optim::DeviceSpec{Kind::cuda, 1});
  CHECK(config.shards[2].device == optim::DeviceSpec{});
}

TEST_CASE("a device that is neither cpu nor cuda:N is rejected with its file, line and key") {
  for (std::string device : {"gpu", "cuda", "cuda:x", "'cuda:-1'"}) {
    CAPTURE(device);
    std::string message;
    try {
      parse("shards:\n  - listen: 127.0.0.1:7000\n    device: " + device + "\n");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::bad_config);
      message = e.what();
    }
    CHECK(message.starts_with("configs/x.yaml:3: shards[0].device: '"));
    CHECK(message.ends_with("' is not a device (expected cpu or cuda:N, e.g. cuda:0)"));
  }
}

}  // namespace
}  // namespace psched
