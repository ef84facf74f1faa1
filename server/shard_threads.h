// SPDX-License-Identifier: Apache-2.0
// ShardThreads: the shards one process serves, spread over event-loop threads: one loop per
// shard, or shards grouped round-robin when there are more shards than threads. Each thread
// owns a ShardHost (its shards' listeners, connections and actors) and its timers, so a push
// is read, applied and answered on one thread (actors/runtime/actor.h). psched-server and the
// benchmarks serve shards with it.
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/loop_thread.h"
#include "common/fork_join_pool.h"
#include "server/shard_host.h"

namespace psched {

class ShardThreads {
 public:
  // Hosts `shards` of `config` (copied; empty: every shard) on at most `threads` loop threads
  // (at least one). Large partitions are applied with `apply_helpers` threads, shared by all
  // shards, besides the shard's own. Throws Error(bad_config) naming what cannot be used.
  ShardThreads(const DeploymentConfig& config, std::vector<ShardId> shards, unsigned threads,
               unsigned apply_helpers);
  ~ShardThreads();  // stop()
  ShardThreads(const ShardThreads&) = delete;
  ShardThreads& operator=(const ShardThreads&) = delete;

  // Restores every shard from its checkpoint directory (when configured; serving shards load
  // the served checkpoints instead, ShardHost::restore), binds every listener, and from then on
  // serves, checkpoints periodically (serving: reloads) and enforces sync timeouts.
  // Throws the first failure (psched::Error naming the shard or the address).
  void start();
  // Fails waiting polls, lets their answers go out, writes the final checkpoints (when
  // configured, of the shards start() restored: a refused start writes none) and destroys the
  // shards on their threads, then joins. Idempotent.
  void stop();

  // Serving shards (config.serve): each loads the newest checkpoint of the served directory
  // beside what it serves and switches to it, or logs why not (ShardHost::reload). Returns at
  // once (the caller goes on taking signals while the shards load). After start().
  void reload();

  // Every shard traces its data streams' requests from now on, the first `capacity` each
  // (server/shard_trace.h).
  void start_tracing(size_t capacity);
  // The traces so far, as one Chrome trace document: each shard a process, "shard N".
  // Before stop().
  nlohmann::json trace();

  // The hosted shards, in the order given to the constructor. Use the shard from another
  // thread only through its methods, which hop onto its loop.
  size_t size() const { return placed_.size(); }
  VariableShard& shard(size_t i);
  const ShardListener& listener(size_t i);

 private:
  struct Group;
  struct Placed {
    Group* group;
    size_t index;  // in the group's host
  };

  const DeploymentConfig config_;  // the hosts refer to it
  ForkJoinPool apply_pool_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<Placed> placed_;
  bool stopped_ = false;
};

}  // namespace psched
