// SPDX-License-Identifier: Apache-2.0
// ShardThreads: the shards one process serves, spread over event-loop threads: one loop per
// shard, or shards grouped round-robin when there are more shards than threads. Each shard
// has its own ShardHost (listener, connections, actor) and timers on its thread, so a push is
// read, applied and answered on one thread (actors/runtime/actor.h). psched-server and the
// benchmarks serve shards with it.
//
// A training shard with a checkpoint directory is claimed (actors/durability/shard_lock.h)
// for as long as it is hosted, so no two processes serve one shard. Shards may also be hosted
// and released while the others serve (host(), release()): how psched-server --server follows
// its deployment file as shards move between server processes (server/server_follower.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/durability/shard_lock.h"
#include "actors/runtime/loop_thread.h"
#include "common/fork_join_pool.h"
#include "server/shard_host.h"

namespace psched {

class ShardThreads {
 public:
  // Hosts `shards` of `config` (copied; empty: every shard) on at most `threads` loop threads
  // (at least one), claiming each. Large partitions are applied with `apply_helpers` threads,
  // shared by all shards, besides the shard's own. Throws Error(bad_config) naming what cannot
  // be used, or the shard another process holds and who that is.
  ShardThreads(const DeploymentConfig& config, std::vector<ShardId> shards, unsigned threads,
               unsigned apply_helpers);
  // Hosts nothing yet: shards come with host().
  ShardThreads(unsigned threads, unsigned apply_helpers);
  ~ShardThreads();  // stop()
  ShardThreads(const ShardThreads&) = delete;
  ShardThreads& operator=(const ShardThreads&) = delete;

  // Restores every shard from its checkpoint directory (when configured; serving shards load
  // the served checkpoints instead, ShardHost::restore), binds every listener, and from then on
  // serves, checkpoints periodically (serving: reloads) and enforces sync timeouts.
  // Throws the first failure (psched::Error naming the shard or the address).
  void start();
  // Fails waiting polls, lets their answers go out, writes the final checkpoints (when
  // configured, of the shards that were restored: a refused start writes none) and destroys
  // the shards on their threads, then joins. Idempotent.
  void stop();

  // What host() did with one shard.
  struct Hosting {
    enum class Outcome { hosted, held, failed } outcome;
    std::string why;  // held: who holds it ("pid 4242 on node-1"); failed: the error
  };
  // Hosts `ids` as `config` says now (kept while each is hosted), each on the thread with the
  // fewest shards then, started as start() starts the others (claimed, restored, its listener
  // bound), the restores side by side. A shard another process holds is not hosted (held), nor
  // one whose restore or bind fails (failed, the shard left as it was). None of `ids` is
  // hosted already. Returns an outcome per id, in order.
  std::vector<Hosting> host(const std::vector<ShardId>& ids,
                            std::shared_ptr<const DeploymentConfig> config);
  // Stops serving shard `id`: closes its listener and its connections, fails its waiting polls
  // and destroys it, then releases its claim. No final checkpoint is written: its update log
  // holds every acknowledged update, and whoever hosts it next restores from them.
  void release(ShardId id);

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

  // The hosted shards: the constructor's in its order, then host()'s. Use a shard from another
  // thread only through its methods, which hop onto its loop.
  std::vector<ShardId> hosted() const;
  size_t size() const { return slots_.size(); }
  // The i-th of hosted().
  VariableShard& shard(size_t i);
  const ShardListener& listener(size_t i);

 private:
  struct Group;
  struct Slot;

  // A slot for `id`, claimed and placed on the thread with the fewest shards; null when another
  // process holds the shard (`holder` then says who).
  std::unique_ptr<Slot> claimed(ShardId id, std::shared_ptr<const DeploymentConfig> config,
                                std::string* holder);
  void make_host(Slot& slot);
  void restore_slot(Slot& slot);
  void serve_slot(Slot& slot);
  void stop_slot(Slot& slot, bool final_checkpoint);

  ForkJoinPool apply_pool_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<Slot>> slots_;
  bool stopped_ = false;
};

}  // namespace psched
