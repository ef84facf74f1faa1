// SPDX-License-Identifier: Apache-2.0
// ShardHost: shards served from one event loop, each with its actor, RPC endpoint and
// listener. Built, used and destroyed on that loop's thread; psched-server runs one host per
// loop thread (server/shard_threads.h), tests one host on their own thread.
#pragma once

#include <memory>
#include <vector>

#include "actors/shard/variable_shard.h"
#include "server/shard_listener.h"

namespace psched {

class ShardHost final : private kj::TaskSet::ErrorHandler {
 public:
  // Hosts `shards` (indices into config.shards) on `loop`. `config` outlives the host. Large
  // partitions are applied on `apply_pool` (optional, outlives the host; shared by hosts) or on
  // the shard's GPU (its `device`). With config.tls, reads the certificate and key now and
  // serves TLS only. Throws Error(bad_config) naming what cannot be used (a device, a
  // certificate).
  ShardHost(const DeploymentConfig& config, const std::vector<ShardId>& shards, ActorLoop& loop,
            ForkJoinPool* apply_pool = nullptr);
  ~ShardHost();

  // Serving (config.serve, psched-server --serve): has every hosted shard load its checkpoint
  // of the served directory read-only instead (VariableShard::serve), rejecting naming what
  // cannot be served.
  // With a checkpoint directory configured: restores every hosted shard from its newest valid
  // checkpoint and update log (logging what it loaded and skipped). Call before listen().
  // Rejects naming the shard when a restore fails. Without a directory: resolves at once.
  kj::Promise<void> restore();
  // Serving: has every hosted shard load the newest checkpoint of the served directory beside
  // the version it serves and switch to it (VariableShard::reload), logging what each serves
  // then or why it refused; resolves when all are done.
  kj::Promise<void> reload();
  // Serving with serve.reload_seconds: reload() that often until the promise is dropped.
  // Otherwise never resolves.
  kj::Promise<void> keep_reloading(kj::Timer& timer);
  bool serving() const { return !config_.serve.directory.empty(); }
  // Checkpoints every hosted shard now (when a directory is configured; never when serving).
  kj::Promise<void> checkpoint();
  // Checkpoints every checkpoint.interval_seconds until the promise is dropped (never resolves
  // when no directory or no interval is configured). A failed checkpoint is logged, and the
  // next is tried at the next interval.
  kj::Promise<void> keep_checkpointing(kj::Timer& timer);

  // Sync or bounded mode with sync.timeout_seconds or sync.lease_seconds: has the shards act on
  // steps and ended leases until the promise is dropped (VariableShard::enforce_deadlines).
  // Otherwise never resolves.
  kj::Promise<void> keep_enforcing_deadlines(kj::Timer& timer);

  // Binds every hosted shard's listen address; resolves once all are bound, and accepts from
  // then on until the host goes. Rejects with psched::Error naming the address when one
  // cannot be bound. `network` and `timer` outlive the host.
  kj::Promise<void> listen(kj::Network& network, kj::Timer& timer);
  // The i-th hosted shard (in the order given to the constructor).
  VariableShard& shard(size_t i) { return *hosted_[i]->shard; }
  ShardListener& listener(size_t i) { return *hosted_[i]->listener; }
  size_t size() const { return hosted_.size(); }
  // From now on every hosted shard traces its data streams' requests, the first `capacity`
  // each (server/shard_trace.h).
  void start_tracing(size_t capacity);
  // The i-th shard's trace; null when not tracing.
  const ShardTrace* trace(size_t i) const { return hosted_[i]->trace.get(); }
  // The i-th shard's free receive buffers (server/receive_buffers.h).
  const ReceiveBuffers& receive_buffers(size_t i) const {
    return *hosted_[i]->endpoint->receive_buffers;
  }
  // Fails waiting polls on every shard; resolves when all have. Turn the loop a little
  // afterwards so the answers go out, then destroy the host (while the loop still exists).
  kj::Promise<void> shut_down();

 private:
  // Calls ask(hosted, fulfiller) for every hosted shard (a SharedFulfiller<void>,
  // actors/runtime/actor.h); resolves when all fulfilled.
  template <typename Ask>
  kj::Promise<void> on_every_shard(Ask ask);
  void taskFailed(kj::Exception&& exception) override;

  struct Hosted {
    std::unique_ptr<optim::ComputeDevice> device;  // null for cpu; outlives `shard`
    std::unique_ptr<VariableShard> shard;
    // Serving: the checkpoint it serves first, read (and its checksum checked) once when the
    // shard was made, for the job's mode and workers; until restore() hands it over.
    std::optional<ShardStore::Checkpoint> first_served;
    std::unique_ptr<ShardTrace> trace;  // null when not tracing; outlives `endpoint`
    std::unique_ptr<ShardEndpoint> endpoint;
    std::unique_ptr<ShardListener> listener;
    kj::Own<kj::ConnectionReceiver> receiver;
  };

  const DeploymentConfig& config_;
  kj::Own<kj::TlsContext> tls_;  // null without config.tls; before the listeners that use it
  std::vector<std::unique_ptr<Hosted>> hosted_;
  kj::TaskSet accepting_;  // last: its accept loops use the listeners
};

}  // namespace psched
