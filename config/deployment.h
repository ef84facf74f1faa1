// SPDX-License-Identifier: Apache-2.0
// A deployment, as one YAML file describes it (configs/local.yaml is the reference example).
// Parsed once into these typed structs and validated at load; code receives them by const&.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/policies.h"
#include "common/shard_settings.h"
#include "common/table_config.h"
#include "common/types.h"
#include "compression/wire_format.h"
#include "config/config_file.h"
#include "optim/device.h"
#include "optim/optimizer.h"

namespace psched {

// "host:port" split; host may be a name, an IPv4 address or a bracketed IPv6 address.
struct ListenAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string to_string() const;  // "host:port"; an IPv6 host in brackets, "[::1]:7000"
  bool operator==(const ListenAddress&) const = default;
};

struct ShardConfig {
  ListenAddress listen;
  // The operator view (metrics, status, dashboard). Default: loopback, the listen port + 1000.
  ListenAddress http = {};
  // Where the shard keeps its variables and optimizer state and applies updates: `cpu` (the
  // default) or `cuda:N`, GPU N (docs/gpu.md). Checked when the server starts, not here.
  optim::DeviceSpec device = {};
  // With `servers:`: the name of the server process that hosts the shard (psched-server
  // --server NAME). Moving a shard to another server is this field and the shard's addresses
  // edited (`psched shards add|remove`); the servers and the trainers follow the file.
  std::string server;
  bool operator==(const ShardConfig&) const = default;
};

// A server process of a deployment whose shards move between servers (`servers:`): it hosts
// the shards the file assigns it, and answers `GET /server` at `control` with what it hosts.
struct ServerConfig {
  std::string name;  // letters, digits, '.', '_', '-'
  ListenAddress control;
  bool operator==(const ServerConfig&) const = default;
};

struct SchedulerConfig {
  SchedulePolicy policy = SchedulePolicy::priority;
  uint64_t partition_bytes = 256 << 10;  // largest partition a tensor is cut into
  uint64_t credit_bytes = 2 << 20;  // bytes in flight at most a direction (one larger may go alone)
  bool autotune = false;
  bool operator==(const SchedulerConfig&) const = default;
};

// What one shard accepts from its clients; a request over a limit is rejected with an error
// naming the field and the limit, and changes nothing.
struct LimitsConfig {
  // Largest message either way (Cap'n Proto traversal limit). A connection's unanswered calls
  // may hold twice this (+ 1 KiB per allowed waiting poll) before the shard stops reading it.
  uint64_t max_message_bytes = 64 << 20;
  uint64_t max_variables = 1 << 20;  // per shard
  uint64_t max_name_bytes = 1024;    // a variable's name
  uint64_t max_shape_dims = 32;      // dimensions of a variable's shape
  uint64_t max_token_bytes = 4096;   // the auth token a connect presents
  // Sessions (connections that completed `connect`) per shard; one more connect is refused
  // with [overloaded] naming the limit, and the worker retries.
  uint64_t max_connections = 1024;
  // Connections that have not completed `connect` yet, per shard; one more closes the oldest
  // of them (as sshd's MaxStartups drops unauthenticated ones), so they never lock workers out.
  uint64_t max_unauthenticated_connections = 64;
  // A connection that has not completed `connect` this long after it opened is closed
  // (PostgreSQL's authentication_timeout).
  uint64_t auth_timeout_seconds = 10;
  uint64_t max_waiting_polls = 1 << 16;  // unanswered polls per connection
  // A connection silent this long in the middle of a message is dropped (between messages it
  // may be silent for ever).
  uint64_t stall_timeout_seconds = 60;
  // Bytes a shard's embedding tables may hold together (0: no limit); a push that would store
  // rows beyond it is refused with [overloaded] naming the table and the limit.
  uint64_t max_table_bytes = 0;
  bool operator==(const LimitsConfig&) const = default;
};

// Durability of a shard's state (actors/durability/shard_store.h). Each shard writes its own files
// (shard-<index>.*), so shards may share a directory.
struct CheckpointConfig {
  std::filesystem::path directory;  // empty: nothing persists; relative to the YAML's folder
  double interval_seconds = 300;    // between periodic checkpoints; 0: only at clean shutdown
  bool update_log = true;           // log accepted updates, so a restart loses none acknowledged
  // Not a YAML key: psched-server --accept-log-loss sets it for one start. A damaged or missing
  // update log then loses the updates it held instead of stopping the start.
  bool accept_log_loss = false;
  // Not a YAML key: who the job is when its shards start with no checkpoint (psched-server
  // --job, else the hash of the deployment's shard addresses); kept in every checkpoint, so
  // `psched reshard` refuses a set mixed from two jobs.
  uint64_t job = 0;
  bool operator==(const CheckpointConfig&) const = default;
};

// Not YAML keys: psched-server --serve and --reload-seconds. Shards that serve a trained job's
// checkpoints read-only to inference clients (VariableShard::serve) instead of training.
struct ServeConfig {
  std::filesystem::path directory;  // the job's checkpoint directory; empty: the shards train
  double reload_seconds = 0;        // look for a newer checkpoint this often (0: at SIGHUP only)
  bool operator==(const ServeConfig&) const = default;
};

// Worker side: what a client does when a shard connection breaks.
struct ReconnectConfig {
  double timeout_seconds = 60;  // keep trying to reconnect this long, then fail what waits
  bool operator==(const ReconnectConfig&) const = default;
};

// TLS on the shard connections (docs/security.md). Each side reads only its files, when it
// starts: a shard server the certificate and key, a worker the CA.
struct TlsConfig {
  ConfigFile cert_file;  // the shard's certificate (PEM), then any intermediates
  ConfigFile key_file;   // its private key (PEM, unencrypted)
  ConfigFile ca_file;    // the CA certificate(s) workers trust (PEM); the system store is not used
  // The name workers check each shard's certificate for; empty: the shard's listen host.
  std::string server_name;
  bool operator==(const TlsConfig&) const = default;
};

struct DeploymentConfig {
  std::filesystem::path source;  // file it was loaded from (for messages)
  // load_deployment's file, absolute; empty for a config parsed from text or built in code.
  // What a client reads again to follow a shard to a new address (ClientOptions).
  std::filesystem::path file;
  Mode mode = Mode::async;
  uint32_t workers = 1;    // workers in the job; sync mode aggregates this many
  std::string auth_token;  // empty: no auth; from `auth: {token: ..}` or `auth: {token_file: ..}`
  std::optional<TlsConfig> tls;     // absent: plain TCP
  std::vector<ShardConfig> shards;  // at least one
  // Empty: each psched-server hosts the shards its --shard flags name, for ever. Otherwise
  // every shard names its server, and shards move between servers as the file is edited.
  std::vector<ServerConfig> servers;
  uint64_t split_bytes = 4 << 20;  // variables larger than this are split across all shards
  // Server default for registrations that name none; a hyper-parameter the file leaves out
  // takes torch.optim's default for the kind (optim::torch_defaults: adam's lr 1e-3, ...).
  optim::OptimizerSpec optimizer;
  SchedulerConfig scheduler;  // worker side
  LimitsConfig limits;
  CheckpointConfig checkpoint;
  ServeConfig serve;
  StepConfig steps;
  ReconnectConfig reconnect;
  DataPathKind data_path = DataPathKind::stream;  // worker side
  // How every variable's gradients and values, and every table's rows (as rows take it:
  // Compression::for_rows), travel unless its trainer says otherwise (`compression:`;
  // compression/wire_format.h). Worker side: the shard reads what it is sent.
  Compression compression;
  // Embedding tables' shard-side settings by name (`tables:`; common/table_config.h).
  std::vector<TableConfig> tables;
  bool operator==(const DeploymentConfig&) const = default;
};

// Loads and validates a deployment file. Throws psched::Error(bad_config) whose message names
// the file, the 1-based line, the key path and what was expected: "configs/x.yaml:7:
// scheduler.credit_bytez: unknown key (expected one of: policy, partition_bytes, credit_bytes,
// autotune)". Omitted keys keep the struct defaults above; `shards` is required. Byte-size keys
// take a number of bytes or a size string ("4MiB", "512KiB", "2MB"; see config/byte_size.h).
// `auth.token_file` is read relative to the file's folder, its trailing newline dropped; the
// `tls` files are resolved likewise but read only by whoever uses them (net/tls.h).
DeploymentConfig load_deployment(const std::filesystem::path& file);
// The same from YAML text; `source` names it in messages.
DeploymentConfig parse_deployment(const std::string& yaml_text,
                                  const std::filesystem::path& source);

// What shard `id` of `config` is told at start (psched-server's shards; psched reshard, which
// replays a shard's update log as its start would): the file's mode, workers, limits,
// checkpoint and step settings, tables and shard count. `id` is below config.shards.size().
ShardSettings shard_settings(const DeploymentConfig& config, ShardId id);

// Every key a deployment file may hold, as a path: "mode", "scheduler.credit_bytes",
// "shards[].listen", "optimizer.lr". docs/configuration.md documents each (config_test checks
// that both name the same keys, and the defaults the document gives).
std::vector<std::string> deployment_keys();

// The indices of the shards `config` assigns to server `name` (shards[].server), in order.
std::vector<ShardId> shards_of_server(const DeploymentConfig& config, std::string_view name);
// The server named `name`, or null.
const ServerConfig* find_server(const DeploymentConfig& config, std::string_view name);

// Parses "127.0.0.1:7000", "localhost:7000", "[::1]:7000"; throws Error(bad_config) otherwise.
ListenAddress parse_listen_address(const std::string& text);

}  // namespace psched
