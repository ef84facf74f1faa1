// SPDX-License-Identifier: Apache-2.0
#include "config/shard_servers.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"

namespace psched {
namespace {

// Shards per server, every server counted (one holding none too).
std::map<std::string, std::vector<ShardId>> by_server(const DeploymentConfig& config) {
  std::map<std::string, std::vector<ShardId>> out;
  for (const ServerConfig& server : config.servers) out[server.name];
  for (uint32_t i = 0; i < config.shards.size(); ++i)
    out[config.shards[i].server].push_back(ShardId(i));
  return out;
}

// Shard `id` moved to `to`: its ports kept, its hosts the server's.
void move_shard(DeploymentConfig& config, ShardId id, const ServerConfig& to,
                std::vector<ShardMove>& moves) {
  ShardConfig& shard = config.shards[id.value];
  moves.push_back({id, shard.server, to.name});
  shard.server = to.name;
  shard.listen.host = to.control.host;
  shard.http.host = to.control.host;
}

void require_servers(const DeploymentConfig& config) {
  if (config.servers.empty())
    fail(ErrorCode::bad_config,
         "{} has no servers: (a job whose shards move names its server processes and gives each "
         "shard one: docs/reliability.md)",
         config.source.string());
}

}  // namespace

DeploymentConfig with_server_added(const DeploymentConfig& config, const ServerConfig& added,
                                   std::vector<ShardMove>& moves) {
  require_servers(config);
  for (const ServerConfig& server : config.servers) {
    if (server.name == added.name)
      fail(ErrorCode::bad_config, "{}: server {} is already in servers:", config.source.string(),
           added.name);
    if (server.control == added.control)
      fail(ErrorCode::bad_config, "{}: {} is already server {}'s control address",
           config.source.string(), added.control.to_string(), server.name);
  }
  const size_t shards = config.shards.size(), servers = config.servers.size() + 1;
  if (shards / servers == 0)
    fail(ErrorCode::bad_config,
         "{}: {} shards on {} servers: server {} would hold none (a job keeps its number of "
         "shards; psched reshard places a stopped job on more)",
         config.source.string(), shards, servers, added.name);
  DeploymentConfig out = config;
  out.servers.push_back(added);
  auto held = by_server(out);
  for (;;) {
    auto most = std::ranges::max_element(held, {}, [](const auto& e) { return e.second.size(); });
    if (most->second.size() <= held[added.name].size() + 1) break;
    const ShardId moved = most->second.back();  // the last: a server keeps its first shards
    most->second.pop_back();
    held[added.name].push_back(moved);
    move_shard(out, moved, added, moves);
  }
  return out;
}

DeploymentConfig with_server_removed(const DeploymentConfig& config, std::string_view name,
                                     std::vector<ShardMove>& moves) {
  require_servers(config);
  if (!find_server(config, name))
    fail(ErrorCode::bad_config, "{}: no server {} in servers:", config.source.string(), name);
  if (config.servers.size() == 1)
    fail(ErrorCode::bad_config, "{}: {} is the only server: its shards would have none",
         config.source.string(), name);
  DeploymentConfig out = config;
  std::erase_if(out.servers, [&](const ServerConfig& s) { return s.name == name; });
  auto held = by_server(out);
  const std::vector<ShardId> leaving = held[std::string(name)];
  held.erase(std::string(name));
  for (ShardId id : leaving) {
    auto fewest = std::ranges::min_element(held, {}, [](const auto& e) { return e.second.size(); });
    fewest->second.push_back(id);
    move_shard(out, id, *find_server(out, fewest->first), moves);
  }
  return out;
}

std::string rewrite_placement(const std::string& yaml, const DeploymentConfig& config) {
  YAML::Node root = YAML::Load(yaml);
  YAML::Node servers(YAML::NodeType::Sequence);
  for (const ServerConfig& server : config.servers) {
    YAML::Node entry;
    entry.SetStyle(YAML::EmitterStyle::Flow);
    entry["name"] = server.name;
    entry["control"] = server.control.to_string();
    servers.push_back(entry);
  }
  root["servers"] = servers;
  YAML::Node shards = root["shards"];
  for (size_t i = 0; i < config.shards.size(); ++i) {
    shards[i]["listen"] = config.shards[i].listen.to_string();
    shards[i]["http"] = config.shards[i].http.to_string();
    shards[i]["server"] = config.shards[i].server;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace psched
