// SPDX-License-Identifier: Apache-2.0
// Which server process hosts which shard, as a deployment file's `servers:` says, and how it
// changes when a server joins or leaves (`psched shards add|remove`). A job keeps its number of
// shards (its rows' and variables' placement) for life; servers come and go, and whole shards
// move between them: start a job with more shards than servers (12 shards on 2 servers) to
// grow it to as many servers as it has shards. docs/reliability.md#moving-shards-between-servers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/deployment.h"

namespace psched {

// One shard changing servers.
struct ShardMove {
  ShardId shard;
  std::string from, to;  // server names
};

// The placement after `added` joins: shards move to it from the servers holding the most, one
// at a time, until no server holds two more than another: the fewest moves that balance the
// servers. A moved shard listens on the new server's host (its control address's), on its
// port unless another shard or server uses that port there (then the port after the highest
// used there); its operator view stays on loopback when it was there. Throws Error(bad_config)
// naming what is wrong: a file without servers:, a name or control address already in use, or a job
// with too few shards to give it one. `moves` receives what moves.
DeploymentConfig with_server_added(const DeploymentConfig& config, const ServerConfig& added,
                                   std::vector<ShardMove>& moves);
// The placement after server `name` leaves: each of its shards goes to the server holding the
// fewest then (ports kept, host the server's). Throws Error(bad_config) for a server the file
// does not name, or the last one.
DeploymentConfig with_server_removed(const DeploymentConfig& config, std::string_view name,
                                     std::vector<ShardMove>& moves);

// The deployment file's YAML text `yaml` with `config`'s servers and shards' listen, http and
// server written in (the rest as it was; YAML comments are not kept).
std::string rewrite_placement(const std::string& yaml, const DeploymentConfig& config);

}  // namespace psched
