// ShardHost: the shards one process serves, each with its actor, RPC endpoint and listener.
// Built and used on the KJ thread; the shard actors run on `io`.
#pragma once

#include <memory>
#include <vector>

#include "actors/variable_shard.h"
#include "net/shard_listener.h"

namespace psched {

class ShardHost {
 public:
  // Hosts `shards` (indices into config.shards). `config` outlives the host. Large partitions
  // are applied with `apply_helpers` threads besides the shard's own, or on the shard's GPU
  // (its `device`). Throws psched::Error(bad_config) naming the shard and its device when that
  // device cannot be used.
  ShardHost(const DeploymentConfig& config, const std::vector<ShardId>& shards, IoContext& io,
            unsigned apply_helpers = 0);
  ~ShardHost();

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
  struct Hosted {
    std::unique_ptr<optim::ComputeDevice> device;  // null for cpu; outlives `shard`
    std::unique_ptr<VariableShard> shard;
    std::unique_ptr<ShardEndpoint> endpoint;
    std::unique_ptr<ShardListener> listener;
    kj::Own<kj::ConnectionReceiver> receiver;
  };

  const DeploymentConfig& config_;
  std::shared_ptr<BufferPool> pool_;
  ForkJoinPool apply_pool_;
  std::vector<std::unique_ptr<Hosted>> hosted_;
};

}  // namespace psched
