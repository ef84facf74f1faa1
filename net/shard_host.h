// ShardHost: the shards one process serves, each with its actor, RPC endpoint and listener.
// Built and used on the KJ thread; the shard actors run on `io`.
#pragma once

#include <memory>
#include <vector>

#include "actors/variable_shard.h"
#include "net/cross_thread_promise.h"
#include "net/shard_listener.h"

namespace psched {

class ShardHost {
 public:
  // Hosts `shards` (indices into config.shards). `config` outlives the host. Large partitions
  // are applied with `apply_helpers` threads besides the shard's own, or on the shard's GPU
  // (its `device`). With config.tls, reads the certificate and key now and serves TLS only.
  // Throws Error(bad_config) naming what cannot be used (a device, a certificate).
  ShardHost(const DeploymentConfig& config, const std::vector<ShardId>& shards, IoContext& io,
            unsigned apply_helpers = 0);
  ~ShardHost();

  // With a checkpoint directory configured: restores every hosted shard from its newest valid
  // checkpoint and update log (logging what it loaded and skipped). Call before listen().
  // Rejects naming the shard when a restore fails. Without a directory: resolves at once.
  kj::Promise<void> restore();
  // Checkpoints every hosted shard now (when a directory is configured).
  kj::Promise<void> checkpoint();
  // Checkpoints every checkpoint.interval_seconds until the promise is dropped (never resolves
  // when no directory or no interval is configured). A failed checkpoint is logged, and the
  // next is tried at the next interval.
  kj::Promise<void> keep_checkpointing(kj::Timer& timer);

  // Sync mode with sync.timeout_seconds: has the shards act on overdue steps until the
  // promise is dropped (VariableShard::enforce_sync_timeout). Otherwise never resolves.
  kj::Promise<void> keep_enforcing_sync_timeout(kj::Timer& timer);

  // Binds every hosted shard's listen address and accepts until the promise is dropped.
  // Throws psched::Error naming the address when one cannot be bound.
  kj::Promise<void> listen(kj::Network& network, kj::Timer& timer);
  // The i-th hosted shard (in the order given to the constructor).
  VariableShard& shard(size_t i) { return *hosted_[i]->shard; }
  ShardListener& listener(size_t i) { return *hosted_[i]->listener; }
  size_t size() const { return hosted_.size(); }
  // Fails waiting polls on every shard; resolves when all have, on the KJ thread. Turn the
  // loop a little afterwards so the answers go out, then stop the actors, then destroy the host
  // (while the KJ loop still exists).
  kj::Promise<void> shut_down();

 private:
  // Calls ask(shard, id, fulfiller) for every hosted shard; resolves when all fulfilled.
  template <typename Ask>
  kj::Promise<void> on_every_shard(Ask ask);

  struct Hosted {
    std::unique_ptr<optim::ComputeDevice> device;  // null for cpu; outlives `shard`
    std::unique_ptr<VariableShard> shard;
    std::unique_ptr<ShardEndpoint> endpoint;
    std::unique_ptr<ShardListener> listener;
    kj::Own<kj::ConnectionReceiver> receiver;
  };

  const DeploymentConfig& config_;
  kj::Own<kj::TlsContext> tls_;  // null without config.tls; before the listeners that use it
  std::shared_ptr<BufferPool> pool_;
  ForkJoinPool apply_pool_;
  std::vector<std::unique_ptr<Hosted>> hosted_;
};

}  // namespace psched
