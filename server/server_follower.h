// SPDX-License-Identifier: Apache-2.0
// ServerFollower: psched-server --server NAME, one server process of a deployment whose shards
// move between processes (`servers:` in the file, docs/reliability.md). It hosts the shards the
// deployment file gives server NAME (`shards[].server`) and follows the file as it changes:
//
//   - a shard no longer given here (or given here at another address) is released: its
//     listener and connections closed, its waiting polls failed, its claim dropped (no final
//     checkpoint: its update log holds every acknowledged update);
//   - a shard newly given here is hosted as soon as the server that had it has let it go (its
//     claim, actors/durability/shard_lock.h): restored from the shared checkpoint directory
//     (checkpoint and update log), its listener bound at its new address.
//
// Trainers follow the same file to the shard's new address as they reconnect
// (ClientOptions::deployment_file), and push again what was not acknowledged, so a sync step
// spanning the move applies every member's push once. The server answers GET /server at its
// control address (`servers[].control`) with what it hosts and waits for; `psched shards`
// asks there before giving it shards.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "config/deployment.h"
#include "server/shard_monitor.h"
#include "server/shard_threads.h"

namespace psched {

class ServerFollower {
 public:
  // Follows server `name` of the deployment in `file`, hosting on `threads` (which outlives the
  // follower). It answers GET /server at `control`, or at the file's control address for
  // `name`; a server the file does not name yet (one about to be added) needs `control`, and
  // hosts nothing until the file gives it shards. `adjust` applies the process's flags to
  // every reading of the file (the job's identity, --accept-log-loss). Hosts nothing before
  // poll(). Throws Error(bad_config) naming what is wrong: a file without `servers:` or a
  // checkpoint directory, a `control` other than the file's, one that cannot be bound.
  ServerFollower(std::string name, std::filesystem::path file, std::optional<ListenAddress> control,
                 std::function<void(DeploymentConfig&)> adjust, ShardThreads& threads);
  ~ServerFollower();  // stops answering GET /server; the shards stay with `threads`

  // Reads the file again when it changed, releases what it no longer gives this server and
  // hosts what it gives, each as soon as it can. Logs what it does and why it waits; throws
  // nothing. psched-server calls it every 50 ms.
  void poll();

  // What GET /server answers: {"server", "pid", "file", "hosted": [shard...], "waiting":
  // [{"shard", "reason"}...]}.
  nlohmann::json status() const;

 private:
  void reread();
  void release_unwanted();
  void host_wanted();
  void record_hosted(ShardId id);
  void publish();

  // A shard hosted here: the file as it was hosted (its listener and monitor refer to it).
  struct Hosted {
    std::shared_ptr<const DeploymentConfig> config;
    ShardConfig as;
    std::unique_ptr<ShardMonitor> monitor;  // null when its http address could not be bound
  };
  struct Waiting {
    std::string reason;  // logged when it changes
    std::chrono::steady_clock::time_point retry_at{};
  };

  const std::string name_;
  const std::filesystem::path file_;
  const std::function<void(DeploymentConfig&)> adjust_;
  ShardThreads& threads_;
  std::shared_ptr<const DeploymentConfig> config_;  // the file as last taken
  std::optional<FileVersion> version_;              // of the reading last tried
  std::map<uint32_t, Hosted> hosted_;               // by shard
  std::map<uint32_t, Waiting> waiting_;             // given here, not hosted yet
  mutable std::mutex status_mutex_;
  nlohmann::json status_;                // guarded by status_mutex_; read by the control thread
  std::unique_ptr<HttpServer> control_;  // last: its handler reads status_
};

}  // namespace psched
