// SPDX-License-Identifier: Apache-2.0
// The simulated cluster with TLS on every shard connection (the certificates in tests/tls/).
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "net/tls.h"
#include "net/wire_convert.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 64;  // split across both shards (split_bytes is 0)

// Two TLS shards whose listen host, 127.0.0.1, is what workers check certificates for.
DeploymentConfig tls_config(const std::string& ca_file = "ca.pem") {
  DeploymentConfig config = cluster_config(2, 2, Mode::async);
  for (ShardConfig& shard : config.shards) shard.listen.host = "127.0.0.1";
  config.tls = test_tls_config(ca_file);
  config.split_bytes = 0;
  config.optimizer.lr = 1.0;  // sgd: each step subtracts the gradient
  return config;
}

// Registers a variable of ones and pushes gradients of ones for `steps` steps; returns its
// value afterwards (1 - steps everywhere when every push went through).
std::vector<float> train_ones(Cluster& cluster, Worker& worker, const std::string& name,
                              uint64_t steps) {
  std::vector<float> value(kElements, 1.f);
  const std::vector<float> gradient(kElements, 1.f);
  VariableSpec spec{name, {kElements}, DType::float32, Priority(0), {}};
  VariableHandle handle =
      cluster.run(worker.register_variable(spec, std::as_writable_bytes(std::span(value)), true));
  for (uint64_t s = 1; s <= steps; ++s) {
    bool done = false;
    worker.push(handle, Step(s), std::as_bytes(std::span(gradient)), [&](std::exception_ptr error) {
      REQUIRE_FALSE(error);
      done = true;
    });
    cluster.run_until([&] { return done; });
  }
  return value;
}

TEST_CASE("workers connected over TLS train") {
  Cluster cluster(tls_config());
  std::vector<float> trained = train_ones(cluster, cluster.add_worker(WorkerId(0), {}), "w", 3);
  CHECK(trained == std::vector<float>(kElements, -2.f));
  // RPC and the data stream (when the worker has one), both TLS
  CHECK(cluster.host().listener(0).connections() == cluster.streams_per_link());
}

TEST_CASE("a worker without TLS is dropped and the shard keeps serving the others") {
  Cluster cluster(tls_config());
  ShardLink& plain = cluster.open_link(0);
  try {
    cluster.run(plain.connect(WorkerId(1), ""));
    FAIL("a plain connection to a TLS shard was served");
  } catch (const kj::Exception& e) {
    CHECK_MESSAGE(from_kj_exception(e).code() == ErrorCode::disconnected, e.getDescription());
  }
  std::vector<float> trained = train_ones(cluster, cluster.add_worker(WorkerId(0), {}), "w", 2);
  CHECK(trained == std::vector<float>(kElements, -1.f));
}

TEST_CASE("a worker that trusts another CA fails naming the shard it tried") {
  Cluster cluster(tls_config("other_ca.pem"));
  try {
    cluster.add_worker(WorkerId(0), {});
    FAIL("a worker connected to a shard whose certificate it cannot trust");
  } catch (const kj::Exception& e) {
    Error error = from_kj_exception(e);
    CHECK(error.code() == ErrorCode::bad_config);
    std::string message = error.what();
    CHECK_MESSAGE(message.starts_with("TLS handshake with shard at 127.0.0.1:1000 failed"),
                  message);
    CHECK_MESSAGE(message.find("not trusted") != std::string::npos, message);
  }
}

}  // namespace

TEST_CASE(
    "over TLS, workers idle between steps stay connected, and a connection stalled inside "
    "a message is dropped after the stall timeout") {
  kj::TimerImpl clock(kj::origin<kj::TimePoint>());  // outlives the shards' connections
  DeploymentConfig config = tls_config();
  config.limits.stall_timeout_seconds = 10;
  config.limits.auth_timeout_seconds = 1000;  // the stall, not the authentication, drops it
  Cluster cluster(config);
  for (size_t s = 0; s < config.shards.size(); ++s) cluster.host().listener(s).use_timer(clock);
  auto wait_seconds = [&](uint64_t seconds) {
    for (uint64_t i = 0; i < seconds; ++i) {
      clock.advanceTo(clock.now() + kj::SECONDS);
      cluster.settle();
    }
  };
  ShardListener& shard = cluster.host().listener(0);
  Worker& worker = cluster.add_worker(WorkerId(0), {});
  train_ones(cluster, worker, "w", 1);
  wait_seconds(3 * config.limits.stall_timeout_seconds);  // between steps: as long as it likes
  const size_t worker_streams = cluster.streams_per_link();
  CHECK(shard.connections() == worker_streams);
  CHECK(train_ones(cluster, worker, "v", 2) == std::vector<float>(kElements, -1.f));

  // Part of a Cap'n Proto message through TLS, then silence.
  auto pipe = kj::newTwoWayPipe();
  shard.serve(kj::mv(pipe.ends[0]));
  auto tls = client_tls_context(*config.tls);
  std::string address = config.shards[0].listen.to_string();
  auto stalled = cluster.run(tls_client_handshake(*tls, kj::mv(pipe.ends[1]), address,
                                                  expected_server_name(*config.tls, address)));
  kj::byte part[28] = {0, 0, 0, 0, 16, 0, 0, 0};  // one segment of 16 words; 20 bytes of it
  cluster.run(stalled->write(part, sizeof(part)));
  CHECK(shard.connections() == worker_streams + 1);
  wait_seconds(config.limits.stall_timeout_seconds - 1);
  CHECK(shard.connections() == worker_streams + 1);
  wait_seconds(2);
  CHECK(shard.connections() == worker_streams);
  CHECK(train_ones(cluster, worker, "u", 1) == std::vector<float>(kElements, 0.f));
}
