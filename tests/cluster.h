// SPDX-License-Identifier: Apache-2.0
// Cluster: a simulated psched cluster in one process and on one thread. Shards and workers
// talk real Cap'n Proto RPC over in-memory pipes; every actor lives on the one event loop the
// test drives, so every run is deterministic (no threads, no sleeps).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/compat/tls.h>
#include <kj/timer.h>

#include "client/worker.h"
#include "config/deployment.h"
#include "server/shard_host.h"
#include "tests/cutting_stream.h"

namespace psched::testing {

// A deployment with `shards` shards (addresses are labels only: nothing listens).
DeploymentConfig cluster_config(uint32_t shards, uint32_t workers, Mode mode);
// The throwaway certificates in tests/tls/: server.pem (localhost, 127.0.0.1) signed by
// ca.pem; workers trust `ca_file` there ("other_ca.pem" signed nothing of ours).
TlsConfig test_tls_config(const std::string& ca_file = "ca.pem");

// How the workers of a Cluster carry their pushes and polls (common/policies.h) unless a test
// says: the environment variable PSCHED_TEST_DATA_PATH ("stream" or "calls"; unset: stream), so
// that ctest runs each cluster test over both front ends of the shard.
DataPathKind default_data_path();

class Cluster {
 public:
  explicit Cluster(DeploymentConfig config, DataPathKind data_path = default_data_path());
  ~Cluster();

  // Connects a new worker to every shard (over TLS when config.tls is set), carrying its pushes
  // and polls as data_path() says; returns it once connected. Its links reconnect (over a new pipe)
  // when their connection breaks.
  Worker& add_worker(WorkerId id, SchedulerConfig scheduler, const std::string& token = "");
  // Cuts the connection of the `worker`-th added worker to `shard` once `after_bytes` more
  // bytes were written on it. The plan, to read its cut count.
  std::shared_ptr<CutPlan> cut(size_t worker, uint32_t shard, uint64_t after_bytes);
  // Opens a raw link to shard `shard` (for tests that send hand-made requests), always without
  // TLS; its own
  // message limit is the deployment's unless `max_message_bytes` is given.
  ShardLink& open_link(uint32_t shard, uint64_t max_message_bytes = 0);
  // Opens a link to shard `shard` that reconnects over a new pipe when its connection breaks,
  // cut as `plan` says, with a data stream as data_path() says (for tests of link/). With
  // `later`, every connection after the first reaches that shard instead (another server at
  // the same address).
  ShardLink& open_reconnecting_link(uint32_t shard, std::shared_ptr<CutPlan> plan,
                                    std::optional<uint32_t> later = {});
  // Opens a data stream for a connected link from open_link (link/data_channel.h).
  kj::Promise<void> open_data_stream(ShardLink& link, uint32_t shard);
  // Closes a link from open_link, as a worker's process dying would.
  void drop_link(ShardLink& link);

  // Runs the loops until `promise` resolves; returns its value (rethrows its failure).
  template <typename T>
  T run(kj::Promise<T> promise) {
    for (size_t turn = 0; turn < kMaxTurns; ++turn) {
      if (promise.poll(scope_)) return promise.wait(scope_);
      tick();
    }
    stalled();
  }
  // Runs the loops until `done()` holds.
  void run_until(const std::function<bool()>& done);
  // Runs the loops until nothing is left to do.
  void settle();

  const DeploymentConfig& config() const { return config_; }
  DataPathKind data_path() const { return data_path_; }
  // The connections a worker holds to each shard: RPC, and its data stream when it has one.
  size_t streams_per_link() const { return data_path_ == DataPathKind::stream ? 2 : 1; }
  ShardHost& host() { return *host_; }
  ActorLoop& loop() { return actors_; }
  kj::WaitScope& scope() { return scope_; }

 private:
  static constexpr size_t kMaxTurns = 1'000'000;
  // Moves the simulated clock (reconnect back-off) on by a millisecond.
  void tick();
  [[noreturn]] void stalled();
  // A worker's stream to `shard`: an in-memory pipe the shard serves, cut as `plan` says,
  // then TLS if configured.
  kj::Promise<kj::Own<kj::AsyncIoStream>> open_stream(uint32_t shard,
                                                      std::shared_ptr<CutPlan> plan);

  DeploymentConfig config_;
  DataPathKind data_path_;
  kj::EventLoop loop_;
  kj::WaitScope scope_;
  ActorLoop actors_;  // every shard and worker actor
  std::unique_ptr<ShardHost> host_;
  kj::Own<kj::TlsContext> client_tls_;  // null without config.tls
  std::vector<kj::Own<ShardLink>> raw_links_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::vector<std::shared_ptr<CutPlan>>> cuts_;  // [worker][shard]
  kj::TimerImpl timer_{kj::origin<kj::TimePoint>()};
};

}  // namespace psched::testing
