// SPDX-License-Identifier: Apache-2.0
// ShardEndpoint: what every connection to one shard shares, whichever front end it speaks
// (Cap'n Proto calls, server/shard_service.h; the data stream, server/data_session.h). Lives
// on the shard's loop and outlives the connections.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "actors/shard/variable_shard.h"
#include "config/deployment.h"
#include "server/receive_buffers.h"
#include "server/shard_trace.h"

namespace psched {

struct ShardEndpoint {
  VariableShard& shard;
  const DeploymentConfig& config;
  ShardId id;
  uint64_t next_poll_ticket = 1;
  // Keys a session gave out for opening its data stream (server/data_session.h), each good for
  // one stream of that session's worker.
  std::unordered_map<std::string, WorkerId> data_keys{};
  // Where the workers' requests are recorded; null when not tracing.
  ShardTrace* trace = nullptr;
  // The data streams' gradient buffers, reused; up to limits.max_message_bytes kept free.
  std::shared_ptr<ReceiveBuffers> receive_buffers =
      ReceiveBuffers::make(config.limits.max_message_bytes);
  // Expires when the endpoint goes; cleanup that may outlive it (a cancelled poll's promise,
  // destroyed with the event loop) checks it before touching the shard.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

}  // namespace psched
