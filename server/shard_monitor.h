// SPDX-License-Identifier: Apache-2.0
// ShardMonitor: serves one hosted shard's operator view over HTTP on its configured `http`
// address: GET /metrics (Prometheus), GET /status (JSON) and GET / (the live dashboard,
// server/dashboard.html, built into the binary).
//
// Each request asks the shard actor for a snapshot (one message to its loop, which copies
// counters) and answers from the copy; the connection count is an atomic. Nothing here
// waits on the data path, and HTTP runs on a thread of its own.
#pragma once

#include <chrono>

#include "server/shard_listener.h"
#include "server/shard_report.h"
#include "view/http_server.h"

namespace psched {

class ShardMonitor {
 public:
  // `shard`, `listener` and `config` outlive the monitor; destroy it before stopping the
  // actors' io_context (a snapshot in flight then answers nobody, harmlessly).
  // Throws psched::Error naming the address when it cannot be bound.
  ShardMonitor(VariableShard& shard, const ShardListener& listener, const DeploymentConfig& config,
               ShardId id);

  uint16_t port() const { return server_.port(); }

 private:
  // Calls `done` on the shard's loop with a snapshot; variables only when `with_variables`.
  // `done` may run after the monitor is destroyed.
  void snapshot(bool with_variables, std::function<void(ShardSnapshot)> done);
  HttpRoutes routes();

  VariableShard& shard_;
  const ShardListener& listener_;
  const DeploymentConfig& config_;
  ShardId id_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  HttpServer server_;  // last: its handlers use the members above
};

}  // namespace psched
