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

bool is_loopback(const std::string& host) {
  return host.starts_with("127.") || host == "localhost" || host == "::1";
}

// `address` on `host`: its port kept unless another shard or a server uses it there; then the
// port after the highest used there.
ListenAddress rehomed(const DeploymentConfig& config, ShardId id, ListenAddress address,
                      const std::string& host) {
  address.host = host;
  std::vector<uint16_t> used;
  for (uint32_t i = 0; i < config.shards.size(); ++i)
    for (const ListenAddress& other : {config.shards[i].listen, config.shards[i].http})
      if (i != id.value && other.host == host) used.push_back(other.port);
  for (const ServerConfig& server : config.servers)
    if (server.control.host == host) used.push_back(server.control.port);
  if (std::ranges::count(used, address.port) > 0)
    address.port = static_cast<uint16_t>(std::ranges::max(used) + 1);
  return address;
}

// Shard `id` moved to `to`: on the server's host (its control address's), its ports kept
// where they are free there. An operator view on loopback stays on loopback.
void move_shard(DeploymentConfig& config, ShardId id, const ServerConfig& to,
                std::vector<ShardMove>& moves) {
  moves.push_back({id, config.shards[id.value].server, to.name});
  config.shards[id.value].server = to.name;
  config.shards[id.value].listen =
      rehomed(config, id, config.shards[id.value].listen, to.control.host);
  const ListenAddress http = config.shards[id.value].http;
  ListenAddress moved =
      rehomed(config, id, http, is_loopback(http.host) ? http.host : to.control.host);
  if (moved == config.shards[id.value].listen) moved.port++;  // both were past every used port
  config.shards[id.value].http = moved;
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
