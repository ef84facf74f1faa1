// SPDX-License-Identifier: Apache-2.0
#include "config/deployment.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "config/byte_size.h"
#include "config/config_node.h"

namespace psched {
namespace {

using config::ConfigMap;
using config::ConfigNode;
using optim::OptimizerSpec;

constexpr std::array<std::string_view, 18> kTopKeys = {
    "mode",        "workers",   "auth",        "shards",    "servers",    "tls",
    "split_bytes", "optimizer", "scheduler",   "limits",    "checkpoint", "sync",
    "reconnect",   "data_path", "compression", "staleness", "tables",     "table_mode"};
constexpr std::array<std::string_view, 8> kTableKeys = {
    "name", "dim", "optimizer", "init", "max_rows", "admit_after", "mode", "staleness"};
constexpr std::array<std::string_view, 2> kTableModeKeys = {"mode", "staleness"};
constexpr std::array<std::string_view, 4> kRowOptimizers = {"sgd", "adagrad", "rowwise_adagrad",
                                                            "sparse_adam"};
constexpr std::array<std::string_view, 10> kCompressionKeys = {
    "push",         "pull",          "topk_fraction", "topk_count",    "min_bytes",
    "warmup_steps", "pull_fraction", "ring",          "refresh_steps", "pull_full"};
// The formats (by name) that `carrying` holds for, in the wire's order.
template <size_t N>
constexpr std::array<std::pair<std::string_view, WireFormat>, N> format_choices(
    bool (*carrying)(WireFormat)) {
  std::array<std::pair<std::string_view, WireFormat>, N> out{};
  size_t n = 0;
  for (WireFormat f : kWireFormats)
    if (carrying(f)) out[n++] = {to_string(f), f};
  return out;
}
constexpr auto kPushFormats = format_choices<kWireFormats.size()>(carries_pushes);
// Values arrive whole: no sparse formats.
constexpr auto kValueFormats =
    format_choices<std::ranges::count_if(kWireFormats, carries_values)>(carries_values);
// Pulls: whole values, or topk deltas of them.
constexpr auto kPullFormats =
    format_choices<std::ranges::count_if(kWireFormats, carries_pulls)>(carries_pulls);
constexpr std::array<std::string_view, 3> kCheckpointKeys = {"directory", "interval_seconds",
                                                             "update_log"};
constexpr std::array<std::string_view, 4> kSyncKeys = {"timeout_seconds", "on_timeout",
                                                       "min_workers", "lease_seconds"};
constexpr std::array<std::string_view, 1> kReconnectKeys = {"timeout_seconds"};
constexpr std::array<std::string_view, 2> kAuthKeys = {"token", "token_file"};
constexpr std::array<std::string_view, 4> kTlsKeys = {"cert_file", "key_file", "ca_file",
                                                      "server_name"};
constexpr std::array<std::string_view, 4> kShardKeys = {"listen", "http", "device", "server"};
constexpr std::array<std::string_view, 2> kServerKeys = {"name", "control"};
// The default HTTP port is the shard's listen port plus this.
constexpr unsigned kHttpPortOffset = 1000;
constexpr std::array<std::string_view, 4> kSchedulerKeys = {"policy", "partition_bytes",
                                                            "credit_bytes", "autotune"};
constexpr std::array<std::string_view, 11> kLimitsKeys = {
    "max_message_bytes",    "max_variables",         "max_name_bytes",
    "max_shape_dims",       "max_token_bytes",       "max_connections",
    "max_waiting_polls",    "stall_timeout_seconds", "max_unauthenticated_connections",
    "auth_timeout_seconds", "max_table_bytes"};
// Tensor fusion and its fused calls were measured to earn nothing once the data stream carried
// pushes (docs/benchmarks.md, "What we tried and dropped"), and went.
constexpr config::RetiredKey kRetiredSchedulerKeys[] = {
    {"fusion_bytes",
     "tensor fusion is gone: the data stream writes the frames of a loop turn together, so small "
     "partitions already share a write; delete the key"}};
constexpr config::RetiredKey kRetiredLimitsKeys[] = {
    {"max_fused_partitions",
     "the fused calls are gone: the data stream writes the frames of a loop turn together, so "
     "small partitions already share a write; delete the key"}};

constexpr std::array<std::pair<std::string_view, Mode>, 3> kModes = {{
    {"async", Mode::async},
    {"sync", Mode::sync},
    {"bounded", Mode::bounded},
}};
constexpr std::array<std::pair<std::string_view, TimeoutAction>, 2> kTimeoutActions = {{
    {"fail", TimeoutAction::fail},
    {"proceed", TimeoutAction::proceed},
}};
constexpr std::array<std::pair<std::string_view, DataPathKind>, 2> kDataPaths = {{
    {"stream", DataPathKind::stream},
    {"calls", DataPathKind::calls},
}};
constexpr std::array<std::pair<std::string_view, SchedulePolicy>, 2> kPolicies = {{
    {"priority", SchedulePolicy::priority},
    {"fifo", SchedulePolicy::fifo},
}};

constexpr std::array<optim::OptimizerKind, 7> kOptimizerKinds = {
    optim::OptimizerKind::sgd,     optim::OptimizerKind::momentum, optim::OptimizerKind::adam,
    optim::OptimizerKind::adam_tf, optim::OptimizerKind::adamw,    optim::OptimizerKind::adagrad,
    optim::OptimizerKind::rmsprop};

// Room a push message needs besides its partition's bytes (name, step, range, framing).
constexpr uint64_t kMessageHeadroomBytes = 64 << 10;

YAML::Node load_yaml(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(ErrorCode::bad_config, "{}:{}: malformed YAML: {}", file, std::max(e.mark.line, 0) + 1,
         e.msg);
  } catch (const YAML::Exception& e) {
    fail(ErrorCode::bad_config, "{}: malformed YAML: {}", file, e.what());
  }
}

// The token file's text without its trailing newline(s). `base_dir` resolves a relative path.
std::string read_token_file(const ConfigNode& node, const std::filesystem::path& base_dir) {
  ConfigFile file = read_file_path(node, base_dir);
  std::string token = read_config_file(file);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) fail_config_file(file, "is empty (expected the token)");
  warn_if_shared(file);
  return token;
}

// Empty when the section is absent: no auth. The token is never echoed in messages.
std::string parse_auth(const ConfigNode& node, const std::filesystem::path& base_dir) {
  ConfigMap auth(node, kAuthKeys);
  if (node.is_null()) return {};
  std::optional<ConfigNode> token = auth.find("token");
  std::optional<ConfigNode> token_file = auth.find("token_file");
  if (token && token_file) token_file->fail("set together with auth.token (expected only one)");
  if (token_file) return read_token_file(*token_file, base_dir);
  if (!token) node.fail_at(node.key_line(), "expected exactly one of: token, token_file");
  std::string value = read_string(*token);
  if (value.empty()) token->fail("is empty (expected a token, or no auth section)");
  return value;
}

std::optional<TlsConfig> parse_tls(const ConfigNode& node, const std::filesystem::path& base_dir) {
  ConfigMap tls(node, kTlsKeys);
  if (node.is_null()) return std::nullopt;
  TlsConfig out{
      .cert_file =
          read_file_path(tls.require("cert_file", "the shards' certificate, PEM"), base_dir),
      .key_file = read_file_path(tls.require("key_file", "its private key, PEM"), base_dir),
      .ca_file = read_file_path(tls.require("ca_file", "the CA that workers trust, PEM"), base_dir),
      .server_name = {}};
  if (auto name = tls.find("server_name")) out.server_name = read_string(*name);
  return out;
}

ListenAddress parse_listen(const ConfigNode& node) {
  std::string text = read_string(node);  // outside the try: its errors carry their own prefix
  try {
    return parse_listen_address(text);
  } catch (const Error& e) {
    node.fail(e.what());
  }
}

optim::DeviceSpec read_device(const ConfigNode& node) {
  std::string text = read_string(node);
  optim::DeviceSpec device;
  if (!optim::parse_device(text, device))
    node.fail(fmt::format("'{}' is not a device (expected cpu or cuda:N, e.g. cuda:0)", text));
  return device;
}

ShardConfig parse_shard(const ConfigNode& node) {
  ConfigMap shard(node, kShardKeys);
  ShardConfig out{.listen = parse_listen(shard.require("listen", "host:port")), .http = {}};
  if (auto device = shard.find("device")) out.device = read_device(*device);
  if (auto server = shard.find("server")) out.server = read_string(*server);
  if (auto http = shard.find("http")) {
    out.http = parse_listen(*http);
  } else if (out.listen.port + kHttpPortOffset > 65535) {
    node.fail(
        fmt::format("listen port {} + {} is no port for the default http address "
                    "(expected an explicit http: host:port)",
                    out.listen.port, kHttpPortOffset));
  } else {
    out.http.port = static_cast<uint16_t>(out.listen.port + kHttpPortOffset);
  }
  return out;
}

// Fails unless every listen and http address of the shards is different.
void check_addresses_unique(const ConfigNode& node, const std::vector<ShardConfig>& shards) {
  const ShardConfig& last = shards.back();
  if (last.http.to_string() == last.listen.to_string())
    node.fail(fmt::format("http address {} is also its listen address (expected another port)",
                          last.http.to_string()));
  for (size_t i = 0; i + 1 < shards.size(); ++i) {
    for (const ListenAddress& mine : {last.listen, last.http}) {
      for (const ListenAddress& theirs : {shards[i].listen, shards[i].http}) {
        if (mine.to_string() != theirs.to_string()) continue;
        node.fail(fmt::format("address {} is also shards[{}]'s (expected one per shard)",
                              mine.to_string(), i));
      }
    }
  }
}

std::vector<ShardConfig> parse_shards(const ConfigNode& node) {
  constexpr std::string_view kExpected = "a list of shards, each with listen: host:port";
  if (node.is_null() || !node.yaml().IsSequence()) node.fail(fmt::format("expected {}", kExpected));
  if (node.yaml().size() == 0) node.fail(fmt::format("empty (expected {})", kExpected));
  std::vector<ShardConfig> shards;
  shards.reserve(node.yaml().size());
  for (const YAML::Node& item : node.yaml()) {
    ConfigNode shard(item, fmt::format("{}[{}]", node.path(), shards.size()), item.Mark(),
                     node.file());
    shards.push_back(parse_shard(shard));
    check_addresses_unique(shard, shards);
  }
  return shards;
}

// A server's name: letters, digits, '.', '_', '-' (it names files and appears in commands).
std::string read_server_name(const ConfigNode& node) {
  std::string name = read_string(node);
  const bool plain = !name.empty() && std::ranges::all_of(name, [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!plain)
    node.fail(
        fmt::format("'{}' is not a server name (expected letters, digits, '.', '_', '-')", name));
  return name;
}

std::vector<ServerConfig> parse_servers(const ConfigNode& node) {
  if (node.is_null()) return {};
  if (!node.yaml().IsSequence() || node.yaml().size() == 0)
    node.fail("expected a list of servers, each with name: and control: host:port");
  std::vector<ServerConfig> servers;
  for (const YAML::Node& item : node.yaml()) {
    ConfigNode entry(item, fmt::format("{}[{}]", node.path(), servers.size()), item.Mark(),
                     node.file());
    ConfigMap server(entry, kServerKeys);
    ServerConfig out{.name = read_server_name(server.require("name", "a server's name")),
                     .control = parse_listen(server.require("control", "host:port"))};
    for (const ServerConfig& other : servers)
      if (other.name == out.name || other.control == out.control)
        entry.fail(fmt::format("{} is also another server's (expected one per server)",
                               other.name == out.name ? out.name : out.control.to_string()));
    servers.push_back(std::move(out));
  }
  return servers;
}

// With `servers:`, every shard names one of them and no control address is a shard's; without,
// no shard names a server.
void check_servers(const ConfigMap& top, const DeploymentConfig& config) {
  ConfigNode shards = top.find_or_null("shards");
  for (size_t i = 0; i < config.shards.size(); ++i) {
    const ShardConfig& shard = config.shards[i];
    ConfigNode entry(shards.yaml()[i], fmt::format("shards[{}]", i), shards.yaml()[i].Mark(),
                     shards.file());
    if (config.servers.empty()) {
      if (!shard.server.empty()) entry.fail("server: needs a servers: list naming the servers");
      continue;
    }
    if (shard.server.empty()) entry.fail("no server: (with servers:, every shard names one)");
    if (!find_server(config, shard.server))
      entry.fail(fmt::format("server '{}' is not in servers:", shard.server));
    for (const ServerConfig& server : config.servers)
      if (server.control == shard.listen || server.control == shard.http)
        entry.fail(fmt::format("address {} is also server {}'s control address",
                               server.control.to_string(), server.name));
  }
}

optim::OptimizerKind read_optimizer_kind(const ConfigNode& node) {
  std::string name = read_string(node);
  optim::OptimizerKind kind{};
  if (optim::parse_optimizer_kind(name, kind)) return kind;
  std::vector<std::string_view> names;
  for (optim::OptimizerKind k : kOptimizerKinds) names.push_back(optim::to_string(k));
  node.fail(fmt::format("'{}' is not one of: {}", name, fmt::join(names, ", ")));
}

std::vector<std::string_view> optimizer_keys() {
  std::vector<std::string_view> keys = {"kind"};
  optim::for_each_hyperparameter([&](std::string_view name, auto) { keys.push_back(name); });
  return keys;
}

OptimizerSpec parse_optimizer(const ConfigNode& node) {
  ConfigMap map(node, optimizer_keys());
  OptimizerSpec spec;
  // What the file leaves out takes torch.optim's default for the kind (optim::torch_defaults).
  if (std::optional<ConfigNode> kind = map.find("kind"))
    spec = optim::torch_defaults(read_optimizer_kind(*kind));
  optim::for_each_hyperparameter([&](std::string_view name, auto member) {
    std::optional<ConfigNode> value = map.find(name);
    if (!value) return;
    if constexpr (std::is_same_v<decltype(member), bool OptimizerSpec::*>)
      spec.*member = read_bool(*value);
    else
      spec.*member = read_number(*value);
  });
  try {
    optim::validate(spec);
  } catch (const Error& e) {
    node.fail_at(node.key_line(), e.what());
  }
  return spec;
}

uint64_t read_partition_bytes(const ConfigNode& node) {
  uint64_t bytes = read_byte_size(node, 1);
  if (bytes % 8 != 0) {
    node.fail(
        fmt::format("{} is not a multiple of 8 (a partition must hold whole elements of "
                    "every dtype)",
                    bytes));
  }
  return bytes;
}

SchedulerConfig parse_scheduler(const ConfigNode& node) {
  ConfigMap map(node, kSchedulerKeys, kRetiredSchedulerKeys);
  SchedulerConfig out;
  if (auto f = map.find("policy")) out.policy = read_choice(*f, kPolicies);
  if (auto f = map.find("partition_bytes")) out.partition_bytes = read_partition_bytes(*f);
  if (auto f = map.find("credit_bytes")) out.credit_bytes = read_byte_size(*f, 1);
  if (auto f = map.find("autotune")) out.autotune = read_bool(*f);
  return out;
}

LimitsConfig parse_limits(const ConfigNode& node) {
  ConfigMap map(node, kLimitsKeys, kRetiredLimitsKeys);
  LimitsConfig out;
  if (auto f = map.find("max_message_bytes")) out.max_message_bytes = read_byte_size(*f, 1);
  if (auto f = map.find("max_variables")) out.max_variables = read_integer(*f, 1, UINT64_MAX);
  if (auto f = map.find("max_name_bytes")) out.max_name_bytes = read_byte_size(*f, 1);
  if (auto f = map.find("max_shape_dims")) out.max_shape_dims = read_integer(*f, 1, UINT32_MAX);
  if (auto f = map.find("max_token_bytes")) out.max_token_bytes = read_byte_size(*f, 1);
  if (auto f = map.find("max_connections")) out.max_connections = read_integer(*f, 1, UINT32_MAX);
  if (auto f = map.find("max_waiting_polls"))
    out.max_waiting_polls = read_integer(*f, 1, UINT32_MAX);
  if (auto f = map.find("stall_timeout_seconds"))
    out.stall_timeout_seconds = read_integer(*f, 1, 86400);
  if (auto f = map.find("max_unauthenticated_connections"))
    out.max_unauthenticated_connections = read_integer(*f, 1, UINT32_MAX);
  if (auto f = map.find("auth_timeout_seconds"))
    out.auth_timeout_seconds = read_integer(*f, 1, 86400);
  if (auto f = map.find("max_table_bytes")) out.max_table_bytes = read_byte_size(*f, 1);
  return out;
}

// A table's init: "zeros", or [uniform, low, high], or [normal, mean, std].
void parse_table_init(const ConfigNode& node, TableConfig& out) {
  constexpr std::string_view kExpected = "zeros, [uniform, low, high] or [normal, mean, std]";
  if (node.yaml().IsScalar()) {
    if (read_string(node) != "zeros") node.fail(fmt::format("expected {}", kExpected));
    out.init = "zeros";
    return;
  }
  if (!node.yaml().IsSequence() || node.yaml().size() != 3)
    node.fail(fmt::format("expected {}", kExpected));
  try {
    out.init = node.yaml()[0].as<std::string>();
    out.init_values = {node.yaml()[1].as<double>(), node.yaml()[2].as<double>()};
  } catch (const YAML::Exception&) {
    node.fail(fmt::format("expected {}", kExpected));
  }
  if (*out.init != "uniform" && *out.init != "normal")
    node.fail(fmt::format("init '{}' (expected {})", *out.init, kExpected));
}

// A table's step rule from its map's `mode:` and `staleness:` (a tables: entry, table_mode:),
// no stricter than the job's mode `job`; none when neither is given.
std::optional<StepRule> parse_rule(const ConfigMap& map, Mode job) {
  auto mode = map.find("mode");
  auto staleness = map.find("staleness");
  if (!mode) {
    if (staleness) staleness->fail("needs mode: bounded beside it");
    return std::nullopt;
  }
  StepRule rule{.mode = read_choice(*mode, kModes)};
  if (strictness(rule.mode) > strictness(job))
    mode->fail(
        fmt::format("{} is stricter than the job's mode: {} (tables may wait less than "
                    "the dense variables, not more)",
                    to_string(rule.mode), to_string(job)));
  if (staleness) {
    if (rule.mode != Mode::bounded) staleness->fail("is only for mode: bounded");
    rule.staleness = read_integer(*staleness, 0, UINT32_MAX);
  }
  return rule;
}

// table_mode: every table's rule where its entry gives none.
std::optional<StepRule> parse_table_mode(const ConfigNode& node, Mode job) {
  if (node.is_null()) return std::nullopt;
  ConfigMap map(node, kTableModeKeys);
  map.require("mode", "the tables' mode: async, bounded or sync");
  return parse_rule(map, job);
}

TableConfig parse_table(const ConfigNode& node, Mode job) {
  ConfigMap map(node, kTableKeys);
  TableConfig out{.name = read_string(map.require("name", "the table's name, as registered"))};
  if (auto f = map.find("dim")) out.dim = static_cast<uint32_t>(read_integer(*f, 1, UINT32_MAX));
  if (auto f = map.find("optimizer")) {
    out.optimizer = read_string(*f);
    if (std::ranges::find(kRowOptimizers, *out.optimizer) == kRowOptimizers.end())
      f->fail(fmt::format("row optimizer '{}' (expected one of: {})", *out.optimizer,
                          fmt::join(kRowOptimizers, ", ")));
  }
  if (auto f = map.find("init")) parse_table_init(*f, out);
  if (auto f = map.find("max_rows")) out.max_rows = read_integer(*f, 1, UINT32_MAX - 1);
  if (auto f = map.find("admit_after")) out.admit_after = read_integer(*f, 1, 255);
  out.rule = parse_rule(map, job);
  return out;
}

std::vector<TableConfig> parse_tables(const ConfigNode& node, Mode job) {
  std::vector<TableConfig> tables;
  if (node.is_null()) return tables;
  if (!node.yaml().IsSequence())
    node.fail("expected a list of tables, each with name: and max_rows:, admit_after:, ...");
  for (const YAML::Node& item : node.yaml()) {
    ConfigNode table(item, fmt::format("{}[{}]", node.path(), tables.size()), item.Mark(),
                     node.file());
    tables.push_back(parse_table(table, job));
    for (size_t i = 0; i + 1 < tables.size(); ++i)
      if (tables[i].name == tables.back().name)
        table.fail(fmt::format("table '{}' is also {}[{}] (expected one entry a table)",
                               tables.back().name, node.path(), i));
  }
  return tables;
}

double read_fraction(const ConfigNode& node) {
  const double fraction = read_number(node);
  if (!TopK::is_fraction(fraction))
    node.fail(fmt::format("{} is not a fraction in (0, 1]", fraction));
  return fraction;
}

Compression parse_compression(const ConfigNode& node) {
  ConfigMap map(node, kCompressionKeys);
  Compression out;
  if (auto f = map.find("push")) out.push = read_choice(*f, kPushFormats);
  if (auto f = map.find("pull")) out.pull = read_choice(*f, kPullFormats);
  if (auto f = map.find("topk_fraction")) out.topk.fraction = read_fraction(*f);
  if (auto f = map.find("pull_fraction")) out.pull_fraction = read_fraction(*f);
  if (auto f = map.find("ring")) out.ring = static_cast<uint16_t>(read_integer(*f, 1, UINT16_MAX));
  if (auto f = map.find("refresh_steps")) out.refresh_steps = read_integer(*f, 0, UINT64_MAX);
  if (auto f = map.find("pull_full")) out.pull_full = read_choice(*f, kValueFormats);
  if (auto f = map.find("topk_count")) out.topk.count = read_integer(*f, 1, UINT32_MAX);
  if (auto f = map.find("min_bytes")) out.min_bytes = read_byte_size(*f, 0);
  if (auto f = map.find("warmup_steps")) out.warmup_steps = read_integer(*f, 0, UINT64_MAX);
  return out;
}

double read_seconds(const ConfigNode& node) {
  double seconds = read_number(node);
  if (seconds < 0) node.fail(fmt::format("{} is negative (expected seconds, 0 or more)", seconds));
  return seconds;
}

CheckpointConfig parse_checkpoint(const ConfigNode& node, const std::filesystem::path& base_dir) {
  ConfigMap map(node, kCheckpointKeys);
  CheckpointConfig out;
  if (node.is_null()) return out;
  out.directory = read_string(map.require("directory", "a directory for checkpoint files"));
  if (out.directory.empty()) map.require("directory", "").fail("is empty (expected a directory)");
  if (out.directory.is_relative()) out.directory = base_dir / out.directory;
  if (auto f = map.find("interval_seconds")) out.interval_seconds = read_seconds(*f);
  if (auto f = map.find("update_log")) out.update_log = read_bool(*f);
  return out;
}

StepConfig parse_steps(const ConfigNode& node, uint32_t workers) {
  ConfigMap map(node, kSyncKeys);
  StepConfig out;
  if (auto f = map.find("timeout_seconds")) out.timeout_seconds = read_seconds(*f);
  if (auto f = map.find("on_timeout")) out.on_timeout = read_choice(*f, kTimeoutActions);
  if (auto f = map.find("min_workers")) {
    out.min_workers = static_cast<uint32_t>(read_integer(*f, 1, UINT32_MAX));
    if (out.min_workers > workers)
      f->fail(fmt::format("{} is more than the job's {} workers", out.min_workers, workers));
  }
  if (auto f = map.find("lease_seconds")) out.lease_seconds = read_seconds(*f);
  return out;
}

ReconnectConfig parse_reconnect(const ConfigNode& node) {
  ConfigMap map(node, kReconnectKeys);
  ReconnectConfig out;
  if (auto f = map.find("timeout_seconds")) out.timeout_seconds = read_seconds(*f);
  return out;
}

// A partition travels in one push message, so it must fit under the message limit. Blames
// scheduler.partition_bytes when the file sets it, else limits.max_message_bytes.
void check_partition_fits(const DeploymentConfig& config, const ConfigMap& top) {
  uint64_t partition = config.scheduler.partition_bytes;
  if (partition + kMessageHeadroomBytes <= config.limits.max_message_bytes) return;
  ConfigNode setting =
      ConfigMap(top.find_or_null("scheduler"), kSchedulerKeys).find_or_null("partition_bytes");
  ConfigNode limit =
      ConfigMap(top.find_or_null("limits"), kLimitsKeys).find_or_null("max_message_bytes");
  (setting.is_null() ? limit : setting)
      .fail(
          fmt::format("scheduler.partition_bytes ({}) plus {} of message header exceeds "
                      "limits.max_message_bytes ({}) (expected a partition to fit in one message)",
                      format_byte_size(partition), format_byte_size(kMessageHeadroomBytes),
                      format_byte_size(config.limits.max_message_bytes)));
}

DeploymentConfig parse_sections(const ConfigNode& root, const std::filesystem::path& source) {
  ConfigMap top(root, kTopKeys);
  DeploymentConfig config;
  config.source = source;
  if (auto f = top.find("mode")) config.mode = read_choice(*f, kModes);
  if (auto f = top.find("workers")) config.workers = read_integer(*f, 1, UINT32_MAX);
  config.auth_token = parse_auth(top.find_or_null("auth"), source.parent_path());
  config.tls = parse_tls(top.find_or_null("tls"), source.parent_path());
  config.shards =
      parse_shards(top.require("shards", "a list of shards, each with listen: host:port"));
  config.servers = parse_servers(top.find_or_null("servers"));
  check_servers(top, config);
  if (auto f = top.find("split_bytes")) config.split_bytes = read_byte_size(*f, 0);
  config.optimizer = parse_optimizer(top.find_or_null("optimizer"));
  config.scheduler = parse_scheduler(top.find_or_null("scheduler"));
  config.limits = parse_limits(top.find_or_null("limits"));
  config.tables = parse_tables(top.find_or_null("tables"), config.mode);
  config.checkpoint = parse_checkpoint(top.find_or_null("checkpoint"), source.parent_path());
  config.steps = parse_steps(top.find_or_null("sync"), config.workers);
  if (auto f = top.find("staleness")) {
    config.steps.staleness = read_integer(*f, 0, UINT32_MAX);
    if (config.mode != Mode::bounded) f->fail("is only for mode: bounded");
  }
  config.steps.tables = parse_table_mode(top.find_or_null("table_mode"), config.mode);
  config.reconnect = parse_reconnect(top.find_or_null("reconnect"));
  if (auto f = top.find("data_path")) config.data_path = read_choice(*f, kDataPaths);
  config.compression = parse_compression(top.find_or_null("compression"));
  check_partition_fits(config, top);
  return config;
}

[[noreturn]] void bad_listen_address(std::string_view text, std::string_view reason) {
  fail(ErrorCode::bad_config,
       "'{}' is not a listen address: {} (expected host:port, e.g. 127.0.0.1:7000, "
       "localhost:7000, [::1]:7000)",
       text, reason);
}

bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-._*%:", c) != nullptr;
}

// Splits "host:port" or "[v6]:port" into its parts; host is returned without brackets.
std::pair<std::string_view, std::string_view> split_host_port(std::string_view text) {
  if (text.starts_with('[')) {
    size_t close = text.find(']');
    if (close == text.npos || text.substr(close + 1, 1) != ":") {
      bad_listen_address(text, "expected [address]:port");
    }
    std::string_view host = text.substr(1, close - 1);
    if (host.find(':') == host.npos) bad_listen_address(text, "brackets are for IPv6 addresses");
    return {host, text.substr(close + 2)};
  }
  size_t colon = text.rfind(':');
  if (colon == text.npos) bad_listen_address(text, "no port");
  std::string_view host = text.substr(0, colon);
  if (host.find(':') != host.npos) bad_listen_address(text, "an IPv6 address needs brackets");
  return {host, text.substr(colon + 1)};
}

}  // namespace

std::string ListenAddress::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::vector<ShardId> shards_of_server(const DeploymentConfig& config, std::string_view name) {
  std::vector<ShardId> out;
  for (uint32_t i = 0; i < config.shards.size(); ++i)
    if (config.shards[i].server == name) out.push_back(ShardId(i));
  return out;
}

const ServerConfig* find_server(const DeploymentConfig& config, std::string_view name) {
  auto found = std::ranges::find(config.servers, name, &ServerConfig::name);
  return found == config.servers.end() ? nullptr : &*found;
}

ListenAddress parse_listen_address(const std::string& text) {
  auto [host, port_text] = split_host_port(text);
  if (host.empty()) bad_listen_address(text, "no host");
  for (char c : host) {
    if (!is_host_char(c)) bad_listen_address(text, fmt::format("'{}' in the host", c));
  }
  unsigned port = 0;
  const char* end = port_text.data() + port_text.size();
  auto [rest, ec] = std::from_chars(port_text.data(), end, port);
  if (rest != end || port_text.empty() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    bad_listen_address(text, "the port is not a number");
  }
  if (port == 0 || port > 65535 || ec == std::errc::result_out_of_range) {
    bad_listen_address(text, fmt::format("port {} is out of range 1-65535", port_text));
  }
  return ListenAddress{.host = std::string(host), .port = static_cast<uint16_t>(port)};
}

DeploymentConfig parse_deployment(const std::string& yaml_text,
                                  const std::filesystem::path& source) {
  const std::string file = source.string();
  ConfigNode root(load_yaml(yaml_text, file), "", YAML::Mark::null_mark(), file);
  return parse_sections(root, source);
}

std::vector<std::string> deployment_keys() {
  // The keys of a top-level section; none for a key that holds a value.
  auto inner_keys = [](std::string_view top) -> std::vector<std::string_view> {
    auto list = [](const auto& names) {
      return std::vector<std::string_view>(names.begin(), names.end());
    };
    if (top == "auth") return list(kAuthKeys);
    if (top == "tls") return list(kTlsKeys);
    if (top == "shards") return list(kShardKeys);
    if (top == "servers") return list(kServerKeys);
    if (top == "optimizer") return optimizer_keys();
    if (top == "scheduler") return list(kSchedulerKeys);
    if (top == "limits") return list(kLimitsKeys);
    if (top == "checkpoint") return list(kCheckpointKeys);
    if (top == "sync") return list(kSyncKeys);
    if (top == "reconnect") return list(kReconnectKeys);
    if (top == "compression") return list(kCompressionKeys);
    if (top == "tables") return list(kTableKeys);
    if (top == "table_mode") return list(kTableModeKeys);
    return {};
  };
  std::vector<std::string> keys;
  for (std::string_view top : kTopKeys) {
    std::vector<std::string_view> inner = inner_keys(top);
    if (inner.empty()) keys.emplace_back(top);
    std::string prefix = top == "shards" || top == "servers" || top == "tables"
                             ? fmt::format("{}[].", top)
                             : fmt::format("{}.", top);
    for (std::string_view name : inner) keys.push_back(prefix + std::string(name));
  }
  return keys;
}

DeploymentConfig load_deployment(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  if (!in || std::filesystem::is_directory(file, ec)) {
    fail(ErrorCode::bad_config, "{}: cannot open the deployment file: {}", file.string(),
         in ? "it is a directory" : std::strerror(errno));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DeploymentConfig config = parse_deployment(text, file);
  config.file = std::filesystem::absolute(file);
  return config;
}

ShardSettings shard_settings(const DeploymentConfig& config, ShardId id) {
  return {id,
          config.mode,
          config.workers,
          config.limits.max_variables,
          config.checkpoint.directory,
          config.checkpoint.update_log,
          config.steps,
          config.checkpoint.accept_log_loss,
          config.limits.max_table_bytes,
          config.tables,
          static_cast<uint32_t>(config.shards.size()),
          config.checkpoint.job,
          config.serve.directory};
}

}  // namespace psched
