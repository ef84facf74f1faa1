// SPDX-License-Identifier: Apache-2.0
#include "config/deployment.h"

#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <unistd.h>

#include "common/error.h"
#include "common/shard_settings.h"

namespace psched {
namespace {

const std::filesystem::path kSourceDir = PSCHED_SOURCE_DIR;

DeploymentConfig parse(const std::string& yaml) {
  return parse_deployment(yaml, "configs/x.yaml");
}

// The message parse() throws; fails the test unless it throws Error(bad_config).
std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    return e.what();
  }
  FAIL("expected Error(bad_config) for:\n" << yaml);
  return {};
}

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "psched_config_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

const std::string kOneShard = "shards:\n  - listen: 127.0.0.1:7000\n";

TEST_CASE("the shipped configs/local.yaml loads and describes two local async shards") {
  DeploymentConfig config = load_deployment(kSourceDir / "configs/local.yaml");
  CHECK(config.source == kSourceDir / "configs/local.yaml");
  CHECK(config.mode == Mode::async);
  CHECK(config.workers == 2);
  CHECK(config.auth_token.empty());
  REQUIRE(config.shards.size() == 2);
  CHECK(config.shards[0].listen.to_string() == "127.0.0.1:7410");
  CHECK(config.shards[1].listen.to_string() == "127.0.0.1:7411");
  CHECK(config.optimizer.kind == optim::OptimizerKind::sgd);
  CHECK(config.optimizer.lr == 0.5);
  CHECK(config.scheduler.policy == SchedulePolicy::priority);
  CHECK(config.scheduler.partition_bytes == 256u << 10);
  CHECK(config.scheduler.credit_bytes == 2u << 20);
  CHECK(config.limits.max_message_bytes == 64u << 20);
}

TEST_CASE("the shipped configs/sync.yaml loads in sync mode") {
  DeploymentConfig config = load_deployment(kSourceDir / "configs/sync.yaml");
  CHECK(config.mode == Mode::sync);
  CHECK(config.shards.size() == 2);
}

TEST_CASE("omitted keys take the struct defaults") {
  DeploymentConfig config = parse(kOneShard);
  const DeploymentConfig defaults;
  CHECK(config.source == "configs/x.yaml");
  CHECK(config.mode == defaults.mode);
  CHECK(config.workers == defaults.workers);
  CHECK(config.auth_token.empty());
  CHECK(config.split_bytes == defaults.split_bytes);
  CHECK(config.optimizer == optim::OptimizerSpec{});
  CHECK(config.scheduler.policy == defaults.scheduler.policy);
  CHECK(config.scheduler.partition_bytes == defaults.scheduler.partition_bytes);
  CHECK(config.scheduler.credit_bytes == defaults.scheduler.credit_bytes);
  CHECK(config.scheduler.autotune == defaults.scheduler.autotune);
  CHECK(config.limits.max_message_bytes == defaults.limits.max_message_bytes);
  CHECK(config.limits.max_variables == defaults.limits.max_variables);
  CHECK(config.limits.max_name_bytes == defaults.limits.max_name_bytes);
  CHECK(config.data_path == DataPathKind::stream);
}

TEST_CASE("data_path chooses how workers carry pushes and polls") {
  DeploymentConfig calls = parse(kOneShard + "data_path: calls\n");
  CHECK(calls.data_path == DataPathKind::calls);
  CHECK(parse(kOneShard + "data_path: stream\n").data_path == DataPathKind::stream);
  CHECK(error_of(kOneShard + "data_path: rpc\n") ==
        "configs/x.yaml:3: data_path: 'rpc' is not one of: stream, calls");
}

TEST_CASE("compression sets every variable's wire formats, checked like every key") {
  DeploymentConfig config =
      parse(kOneShard +
            "compression: {push: topk, pull: bf16, topk_fraction: 0.02, min_bytes: 1MiB, "
            "warmup_steps: 100}\n");
  CHECK(config.compression.push == WireFormat::topk);
  CHECK(config.compression.pull == WireFormat::bf16);
  CHECK(config.compression.topk.fraction == 0.02);
  CHECK(config.compression.topk.count == 0);
  CHECK(config.compression.min_bytes == 1 << 20);
  CHECK(config.compression.warmup_steps == 100);
  CHECK(parse(kOneShard + "compression: {topk_count: 50}\n").compression.topk.count == 50);
  Compression defaults = parse(kOneShard).compression;
  CHECK(defaults.push == WireFormat::none);
  CHECK(defaults.pull == WireFormat::none);
  CHECK(defaults.min_bytes == 64 * 1024);
  CHECK(error_of(kOneShard + "compression: {pull: onebit}\n") ==
        "configs/x.yaml:3: compression.pull: 'onebit' is not one of: none, bf16, fp16, topk");
  Compression deltas = parse(kOneShard +
                             "compression: {pull: topk, pull_fraction: 0.05, ring: 8, "
                             "refresh_steps: 50, pull_full: bf16}\n")
                           .compression;
  CHECK(deltas.pull == WireFormat::topk);
  CHECK(deltas.pull_fraction == 0.05);
  CHECK(deltas.ring == 8);
  CHECK(deltas.refresh_steps == 50);
  CHECK(deltas.pull_full == WireFormat::bf16);
  CHECK(defaults.ring == 4);
  CHECK(defaults.refresh_steps == 0);
  CHECK(error_of(kOneShard + "compression: {pull_full: topk}\n") ==
        "configs/x.yaml:3: compression.pull_full: 'topk' is not one of: none, bf16, fp16");
  CHECK(error_of(kOneShard + "compression: {ring: 0}\n").find("compression.ring") !=
        std::string::npos);
  CHECK(error_of(kOneShard + "compression: {pull_fraction: 0}\n") ==
        "configs/x.yaml:3: compression.pull_fraction: 0 is not a fraction in (0, 1]");
  CHECK(error_of(kOneShard + "compression: {push: int8}\n") ==
        "configs/x.yaml:3: compression.push: 'int8' is not one of: none, bf16, fp16, topk, onebit");
  CHECK(error_of(kOneShard + "compression: {topk_fraction: 1.5}\n") ==
        "configs/x.yaml:3: compression.topk_fraction: 1.5 is not a fraction in (0, 1]");
  CHECK(error_of(kOneShard + "compression: {level: 3}\n").find("compression.level: unknown key") !=
        std::string::npos);
}

TEST_CASE("table_mode: and a table's mode: give tables their own step rule, never stricter") {
  const std::string sync = kOneShard + "mode: sync\n";
  DeploymentConfig config = parse(sync +
                                  "table_mode: {mode: bounded, staleness: 2}\n"
                                  "tables:\n"
                                  "  - {name: users, mode: async}\n"
                                  "  - {name: items}\n");
  CHECK(config.steps.tables == StepRule{.mode = Mode::bounded, .staleness = 2});
  CHECK(config.tables[0].rule == StepRule{.mode = Mode::async});
  CHECK_FALSE(config.tables[1].rule);
  ShardSettings settings{.mode = config.mode, .steps = config.steps, .tables = config.tables};
  CHECK(settings.table_rule("users") == StepRule{.mode = Mode::async});
  CHECK(settings.table_rule("items") == StepRule{.mode = Mode::bounded, .staleness = 2});
  CHECK(settings.dense_rule().mode == Mode::sync);
  CHECK_FALSE(parse(sync).steps.tables);
  CHECK(ShardSettings{.mode = Mode::sync}.table_rule("any").mode == Mode::sync);

  CHECK(error_of(kOneShard + "table_mode: {mode: bounded}\n")
            .find("table_mode.mode: bounded is stricter than the job's mode: async") !=
        std::string::npos);
  CHECK(error_of(kOneShard + "mode: bounded\ntables:\n  - {name: t, mode: sync}\n")
            .find("tables[0].mode: sync is stricter") != std::string::npos);
  CHECK(error_of(sync + "table_mode: {staleness: 1}\n").find("table_mode") != std::string::npos);
  CHECK(error_of(sync + "tables:\n  - {name: t, staleness: 1}\n")
            .find("needs mode: bounded beside it") != std::string::npos);
  CHECK(error_of(sync + "table_mode: {mode: async, staleness: 1}\n")
            .find("is only for mode: bounded") != std::string::npos);
  CHECK(error_of(sync + "table_mode: {mode: later}\n").find("table_mode.mode") !=
        std::string::npos);
}

TEST_CASE("tables: gives tables their capacity by name; limits.max_table_bytes bounds them all") {
  DeploymentConfig config =
      parse(kOneShard +
            "tables:\n"
            "  - {name: users, dim: 64, optimizer: adagrad, max_rows: 2000000, admit_after: 2}\n"
            "  - {name: items, init: [uniform, -0.5, 0.5]}\n"
            "  - {name: ads, init: zeros}\n"
            "limits: {max_table_bytes: 48GiB}\n");
  REQUIRE(config.tables.size() == 3);
  CHECK(config.tables[0] == TableConfig{.name = "users",
                                        .max_rows = 2000000,
                                        .admit_after = 2,
                                        .dim = 64,
                                        .optimizer = "adagrad"});
  CHECK(config.tables[1].init == "uniform");
  CHECK(config.tables[1].init_values == std::vector<double>{-0.5, 0.5});
  CHECK(config.tables[1].max_rows == 0);
  CHECK(config.tables[2].init == "zeros");
  CHECK(config.limits.max_table_bytes == uint64_t{48} << 30);
  CHECK(parse(kOneShard).tables.empty());
  CHECK(parse(kOneShard).limits.max_table_bytes == 0);
  CHECK(error_of(kOneShard + "tables:\n  - {name: t}\n  - {name: t}\n")
            .find("table 't' is also tables[0]") != std::string::npos);
  CHECK(error_of(kOneShard + "tables:\n  - {name: t, optimizer: adam}\n")
            .find("row optimizer 'adam' (expected one of: sgd, adagrad, rowwise_adagrad, "
                  "sparse_adam)") != std::string::npos);
  CHECK(
      error_of(kOneShard + "tables:\n  - {name: t, init: [uniform, 1]}\n").find("expected zeros") !=
      std::string::npos);
  CHECK(error_of(kOneShard + "tables:\n  - {name: t, admit_after: 256}\n")
            .find("tables[0].admit_after") != std::string::npos);
  CHECK(error_of(kOneShard + "tables:\n  - {max_rows: 5}\n").find("name") != std::string::npos);
  CHECK(error_of(kOneShard + "tables: {name: t}\n").find("expected a list of tables") !=
        std::string::npos);
}

TEST_CASE("empty sections read as all defaults") {
  DeploymentConfig config = parse(kOneShard + "auth:\noptimizer:\nscheduler: {}\nlimits:\n");
  CHECK(config.auth_token.empty());
  CHECK(config.optimizer == optim::OptimizerSpec{});
  CHECK(config.scheduler.partition_bytes == SchedulerConfig{}.partition_bytes);
}

TEST_CASE("every key is read into its field") {
  DeploymentConfig config = parse(R"(mode: sync
workers: 8
auth: {token: s3cret}
shards:
  - listen: 10.0.0.1:7000
  - listen: "[::1]:7001"
  - listen: localhost:7002
split_bytes: 1048576
optimizer:
  kind: adam
  lr: 1e-3
  beta1: 0.8
  beta2: 0.99
  eps: 0.0001
  weight_decay: 0.01
  amsgrad: true
scheduler:
  policy: fifo
  partition_bytes: 512KiB
  credit_bytes: 2MB
  autotune: true
limits:
  max_message_bytes: 1GiB
  max_variables: 100
  max_name_bytes: 256B
  max_shape_dims: 8
  max_token_bytes: 1KiB
  max_connections: 50
  max_waiting_polls: 7
  stall_timeout_seconds: 5
  max_unauthenticated_connections: 7
  auth_timeout_seconds: 3
)");
  CHECK(config.mode == Mode::sync);
  CHECK(config.workers == 8);
  CHECK(config.auth_token == "s3cret");
  REQUIRE(config.shards.size() == 3);
  CHECK(config.shards[0].listen.host == "10.0.0.1");
  CHECK(config.shards[1].listen.host == "::1");
  CHECK(config.shards[1].listen.port == 7001);
  CHECK(config.shards[2].listen.host == "localhost");
  CHECK(config.split_bytes == 1u << 20);
  optim::OptimizerSpec adam{.kind = optim::OptimizerKind::adam,
                            .lr = 1e-3,
                            .beta1 = 0.8,
                            .beta2 = 0.99,
                            .eps = 1e-4,
                            .weight_decay = 0.01,
                            .amsgrad = true};
  CHECK(config.optimizer == adam);
  CHECK(config.scheduler.policy == SchedulePolicy::fifo);
  CHECK(config.scheduler.partition_bytes == 512u << 10);
  CHECK(config.scheduler.credit_bytes == 2000000u);
  CHECK(config.scheduler.autotune);
  CHECK(config.limits.max_message_bytes == 1u << 30);
  CHECK(config.limits.max_variables == 100);
  CHECK(config.limits.max_name_bytes == 256);
  CHECK(config.limits.max_shape_dims == 8);
  CHECK(config.limits.max_token_bytes == 1024);
  CHECK(config.limits.max_connections == 50);
  CHECK(config.limits.max_waiting_polls == 7);
  CHECK(config.limits.stall_timeout_seconds == 5);
  CHECK(config.limits.max_unauthenticated_connections == 7);
  CHECK(config.limits.auth_timeout_seconds == 3);
}

TEST_CASE("an optimizer hyper-parameter left out takes torch.optim's default for the kind") {
  CHECK(parse(kOneShard + "optimizer: {kind: adam}\n").optimizer.lr == 1e-3);
  DeploymentConfig adamw = parse(kOneShard + "optimizer: {kind: adamw, lr: 0.5}\n");
  CHECK(adamw.optimizer.lr == 0.5);
  CHECK(adamw.optimizer.weight_decay == 1e-2);
  CHECK(parse(kOneShard + "optimizer: {kind: adagrad}\n").optimizer.eps == 1e-10);
  CHECK(parse(kOneShard + "optimizer: {kind: sgd}\n").optimizer.lr == 0.01);  // torch has none
}

TEST_CASE("every optimizer hyper-parameter can be set by its field name") {
  DeploymentConfig config = parse(kOneShard + R"(optimizer:
  kind: rmsprop
  lr: 0.5
  momentum: 0.25
  dampening: 0
  nesterov: false
  beta1: 0.5
  beta2: 0.75
  eps: 1e-6
  weight_decay: 0.125
  amsgrad: false
  lr_decay: 0.0625
  initial_accumulator_value: 0.1
  alpha: 0.95
  centered: true
)");
  optim::OptimizerSpec want{.kind = optim::OptimizerKind::rmsprop,
                            .lr = 0.5,
                            .momentum = 0.25,
                            .beta1 = 0.5,
                            .beta2 = 0.75,
                            .eps = 1e-6,
                            .weight_decay = 0.125,
                            .lr_decay = 0.0625,
                            .initial_accumulator_value = 0.1,
                            .alpha = 0.95,
                            .centered = true};
  CHECK(config.optimizer == want);
}

TEST_CASE("size strings and plain integers both parse as byte sizes") {
  auto partition = [](const std::string& value) {
    return parse(kOneShard + "scheduler:\n  partition_bytes: " + value + "\n")
        .scheduler.partition_bytes;
  };
  CHECK(partition("4096") == 4096u);
  CHECK(partition("104B") == 104u);
  CHECK(partition("512KiB") == 512u << 10);
  CHECK(partition("4MiB") == 4u << 20);
  CHECK(partition("2MB") == 2000000u);
  CHECK(partition("\"8 KiB\"") == 8u << 10);
  CHECK(parse(kOneShard + "split_bytes: 1GiB\nlimits: {max_message_bytes: 2GiB}\n").split_bytes ==
        1u << 30);
}

TEST_CASE("an unknown key is named with its path, its line and the keys allowed there") {
  CHECK(error_of(kOneShard + "scheduler:\n  policy: fifo\n  credit_bytez: 4MiB\n") ==
        "configs/x.yaml:5: scheduler.credit_bytez: unknown key (expected one of: policy, "
        "partition_bytes, credit_bytes, autotune)");
  CHECK(error_of("mode: async\nhttp: 8080\n" + kOneShard)
            .starts_with("configs/x.yaml:2: http: unknown key (expected one of: mode, workers, "
                         "auth, shards, "));
  CHECK(error_of(kOneShard + "optimizer: {kind: sgd, learning_rate: 1}\n")
            .starts_with("configs/x.yaml:3: optimizer.learning_rate: unknown key (expected one of: "
                         "kind, lr, "));
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:7000\n    port: 1\n") ==
        "configs/x.yaml:3: shards[0].port: unknown key (expected one of: listen, http, device, "
        "server)");
}

TEST_CASE("a repeated key is an error naming both lines") {
  CHECK(error_of("workers: 2\n" + kOneShard + "workers: 3\n") ==
        "configs/x.yaml:4: workers: duplicate key (first at line 1)");
}

TEST_CASE("an enum value outside its choices lists the choices") {
  CHECK(error_of("# comment\n\nmode: asink\n" + kOneShard) ==
        "configs/x.yaml:3: mode: 'asink' is not one of: async, sync, bounded");
  CHECK(error_of(kOneShard + "scheduler:\n  policy: lifo\n") ==
        "configs/x.yaml:4: scheduler.policy: 'lifo' is not one of: priority, fifo");
  CHECK(error_of(kOneShard + "optimizer:\n  kind: adamax\n") ==
        "configs/x.yaml:4: optimizer.kind: 'adamax' is not one of: sgd, momentum, adam, adam_tf, "
        "adamw, adagrad, rmsprop");
}

TEST_CASE("a bad byte size names the key, the line and the value") {
  CHECK(error_of(kOneShard + "scheduler:\n  policy: fifo\n  partition_bytes: 12 furlongs\n")
            .starts_with("configs/x.yaml:5: scheduler.partition_bytes: '12 furlongs' is not a "
                         "byte size (expected"));
  CHECK(error_of(kOneShard + "split_bytes: -1\n")
            .starts_with("configs/x.yaml:3: split_bytes: '-1' is not a byte size"));
  CHECK(error_of(kOneShard + "limits:\n  max_message_bytes: [1]\n") ==
        "configs/x.yaml:4: limits.max_message_bytes: expected a byte size, got a list");
}

TEST_CASE("partition and credit sizes must be positive and partitions a multiple of 8") {
  CHECK(error_of(kOneShard + "scheduler:\n  credit_bytes: 0\n") ==
        "configs/x.yaml:4: scheduler.credit_bytes: must be at least 1, got 0");
  CHECK(error_of(kOneShard + "scheduler:\n  partition_bytes: 0B\n") ==
        "configs/x.yaml:4: scheduler.partition_bytes: must be at least 1, got 0B");
  CHECK(error_of(kOneShard + "scheduler:\n  partition_bytes: 1001\n") ==
        "configs/x.yaml:4: scheduler.partition_bytes: 1001 is not a multiple of 8 (a partition "
        "must hold whole elements of every dtype)");
}

TEST_CASE("a partition must fit in one message") {
  CHECK(error_of(kOneShard + "scheduler:\n  partition_bytes: 64MiB\n")
            .starts_with("configs/x.yaml:4: scheduler.partition_bytes: scheduler.partition_bytes "
                         "(64MiB) plus 64KiB "
                         "of message header exceeds limits.max_message_bytes (64MiB)"));
  CHECK(error_of(kOneShard + "limits:\n  max_message_bytes: 256KiB\n")
            .starts_with(
                "configs/x.yaml:4: limits.max_message_bytes: scheduler.partition_bytes (256KiB)"));
}

TEST_CASE("a shard must accept at least one connection") {
  CHECK(error_of(kOneShard + "limits:\n  max_connections: 0\n") ==
        "configs/x.yaml:4: limits.max_connections: must be at least 1, got 0");
}

TEST_CASE("a key of the removed tensor fusion is refused at its line, saying why it went") {
  CHECK(error_of(kOneShard + "scheduler:\n  policy: fifo\n  fusion_bytes: 64KiB\n") ==
        "configs/x.yaml:5: scheduler.fusion_bytes: removed: tensor fusion is gone: the data "
        "stream writes the frames of a loop turn together, so small partitions already share a "
        "write; delete the key");
  CHECK(error_of(kOneShard + "limits:\n  max_fused_partitions: 1024\n") ==
        "configs/x.yaml:4: limits.max_fused_partitions: removed: the fused calls are gone: the "
        "data stream writes the frames of a loop turn together, so small partitions already "
        "share a write; delete the key");
}

TEST_CASE("integers must be whole numbers within range") {
  CHECK(error_of("workers: 0\n" + kOneShard) ==
        "configs/x.yaml:1: workers: must be at least 1, got 0");
  CHECK(error_of("workers: -3\n" + kOneShard) ==
        "configs/x.yaml:1: workers: must be at least 1, got -3");
  CHECK(error_of("workers: 4294967296\n" + kOneShard) ==
        "configs/x.yaml:1: workers: must be at most 4294967295, got 4294967296");
  CHECK(error_of("workers: two\n" + kOneShard) ==
        "configs/x.yaml:1: workers: 'two' is not an integer");
  CHECK(error_of("workers:\n" + kOneShard) ==
        "configs/x.yaml:1: workers: missing value (expected an integer)");
  CHECK(error_of(kOneShard + "limits: {max_variables: 1.5}\n") ==
        "configs/x.yaml:3: limits.max_variables: '1.5' is not an integer");
}

TEST_CASE("booleans and numbers are checked") {
  CHECK(error_of(kOneShard + "scheduler:\n  autotune: maybe\n") ==
        "configs/x.yaml:4: scheduler.autotune: 'maybe' is not true or false");
  CHECK(error_of(kOneShard + "optimizer:\n  lr: fast\n") ==
        "configs/x.yaml:4: optimizer.lr: 'fast' is not a finite number");
  CHECK(error_of(kOneShard + "optimizer:\n  lr: .nan\n") ==
        "configs/x.yaml:4: optimizer.lr: '.nan' is not a finite number");
}

TEST_CASE("a missing or empty shard list names shards") {
  CHECK(error_of("mode: async\n").starts_with("configs/x.yaml:1: shards: missing (expected"));
  CHECK(error_of("").starts_with("configs/x.yaml:1: shards: missing (expected"));
  CHECK(error_of("mode: async\nshards: []\n").starts_with("configs/x.yaml:2: shards: empty"));
  CHECK(
      error_of("mode: async\nshards:\n").starts_with("configs/x.yaml:2: shards: expected a list"));
  CHECK(error_of("shards: 127.0.0.1:7000\n")
            .starts_with("configs/x.yaml:1: shards: expected a list"));
  CHECK(error_of("shards:\n  - 127.0.0.1:7000\n")
            .starts_with("configs/x.yaml:2: shards[0]: expected a map with keys from: listen"));
  CHECK(error_of("shards:\n  - {}\n") ==
        "configs/x.yaml:2: shards[0].listen: missing (expected host:port)");
  CHECK(error_of("shards:\n  - listen:\n") ==
        "configs/x.yaml:2: shards[0].listen: missing value (expected a string)");
}

TEST_CASE("two shards on one address are an error") {
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:7000\n  - listen: 127.0.0.1:7001\n"
                 "  - listen: 127.0.0.1:7000\n") ==
        "configs/x.yaml:4: shards[2]: address 127.0.0.1:7000 is also shards[0]'s "
        "(expected one per shard)");
}

TEST_CASE("a shard's http address defaults to loopback at its listen port + 1000") {
  DeploymentConfig config = parse(
      "shards:\n  - listen: 0.0.0.0:7000\n  - {listen: 127.0.0.1:7001, http: "
      "0.0.0.0:9000}\n");
  CHECK(config.shards[0].http.to_string() == "127.0.0.1:8000");
  CHECK(config.shards[1].http.to_string() == "0.0.0.0:9000");
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:65000\n")
            .starts_with("configs/x.yaml:2: shards[0]: listen port 65000 + 1000 is no port"));
}

TEST_CASE("an http address taken by another address of the deployment is an error") {
  CHECK(error_of("shards:\n  - {listen: 127.0.0.1:7000, http: 127.0.0.1:7000}\n") ==
        "configs/x.yaml:2: shards[0]: http address 127.0.0.1:7000 is also its listen address "
        "(expected another port)");
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:7000\n  - listen: 127.0.0.1:8000\n") ==
        "configs/x.yaml:3: shards[1]: address 127.0.0.1:8000 is also shards[0]'s "
        "(expected one per shard)");
}

TEST_CASE("a shard port must be in 1-65535") {
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:0\n") ==
        "configs/x.yaml:2: shards[0].listen: '127.0.0.1:0' is not a listen address: port 0 is "
        "out of range 1-65535 (expected host:port, e.g. 127.0.0.1:7000, localhost:7000, "
        "[::1]:7000)");
  CHECK(error_of("shards:\n  - listen: 127.0.0.1:7000\n  - listen: 127.0.0.1:65536\n")
            .starts_with("configs/x.yaml:3: shards[1].listen: '127.0.0.1:65536' is not a listen "
                         "address: port 65536 is out of range 1-65535"));
}

TEST_CASE("listen addresses parse names, IPv4 and bracketed IPv6") {
  ListenAddress v4 = parse_listen_address("127.0.0.1:7000");
  CHECK(v4.host == "127.0.0.1");
  CHECK(v4.port == 7000);
  CHECK(parse_listen_address("localhost:7000").host == "localhost");
  ListenAddress v6 = parse_listen_address("[::1]:7000");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 7000);
  CHECK(v6.to_string() == "[::1]:7000");
  CHECK(v4.to_string() == "127.0.0.1:7000");
  CHECK(parse_listen_address("[fe80::1%eth0]:65535").to_string() == "[fe80::1%eth0]:65535");
  for (const char* bad :
       {"", "127.0.0.1", ":7000", "127.0.0.1:", "host:port", "::1:7000", "[::1]7000", "[::1:7000",
        "[127.0.0.1]:7000", "a b:7000", "h:99999999999", "h:-1", "h:+1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_listen_address(bad), Error);
  }
}

TEST_CASE("auth takes exactly one of token and token_file") {
  CHECK(parse(kOneShard + "auth:\n  token: \"s3cret\"\n").auth_token == "s3cret");
  CHECK(error_of(kOneShard + "auth:\n  token: a\n  token_file: b\n") ==
        "configs/x.yaml:5: auth.token_file: set together with auth.token (expected only one)");
  CHECK(error_of(kOneShard + "auth: {}\n") ==
        "configs/x.yaml:3: auth: expected exactly one of: token, token_file");
  CHECK(error_of(kOneShard + "auth:\n  token: \"\"\n")
            .starts_with("configs/x.yaml:4: auth.token: is empty"));
  CHECK(
      error_of(kOneShard + "auth:\n  password: x\n")
          .starts_with(
              "configs/x.yaml:4: auth.password: unknown key (expected one of: token, token_file)"));
}

TEST_CASE("token_file is read relative to the YAML file's folder without its trailing newline") {
  TempDir dir;
  dir.write("secret.txt", "t0ken\n");
  dir.write("deploy.yaml", kOneShard + "auth:\n  token_file: secret.txt\n");
  CHECK(load_deployment(dir.path() / "deploy.yaml").auth_token == "t0ken");
  CHECK(parse_deployment(kOneShard + "auth: {token_file: secret.txt}\n", dir.path() / "any.yaml")
            .auth_token == "t0ken");

  dir.write("crlf.txt", "t0ken\r\n");
  dir.write("deploy2.yaml",
            kOneShard + "auth:\n  token_file: " + (dir.path() / "crlf.txt").string() + "\n");
  CHECK(load_deployment(dir.path() / "deploy2.yaml").auth_token == "t0ken");

  dir.write("empty.txt", "\n");
  dir.write("deploy3.yaml", kOneShard + "auth:\n  token_file: empty.txt\n");
  CHECK_THROWS_WITH_AS(load_deployment(dir.path() / "deploy3.yaml"),
                       doctest::Contains(":4: auth.token_file: '"), Error);
}

TEST_CASE("a missing token_file names the key and the resolved path") {
  TempDir dir;
  dir.write("deploy.yaml", kOneShard + "auth:\n  token_file: nope.txt\n");
  std::string path = (dir.path() / "deploy.yaml").string();
  std::string secret = (dir.path() / "nope.txt").string();
  CHECK_THROWS_WITH_AS(
      load_deployment(path),
      (path + ":4: auth.token_file: cannot open '" + secret + "': No such file or directory")
          .c_str(),
      Error);
}

TEST_CASE("checkpoint, sync and reconnect sections read into their fields") {
  DeploymentConfig c = parse(
      "shards: [{listen: 127.0.0.1:7000}]\n"
      "checkpoint: {directory: state, interval_seconds: 30, update_log: false}\n"
      "sync: {timeout_seconds: 12.5, on_timeout: proceed}\n"
      "reconnect: {timeout_seconds: 5}\n");
  CHECK(c.checkpoint.directory == std::filesystem::path("configs/state"));
  CHECK(c.checkpoint.interval_seconds == 30);
  CHECK_FALSE(c.checkpoint.update_log);
  CHECK(c.steps.timeout_seconds == 12.5);
  CHECK(c.steps.on_timeout == TimeoutAction::proceed);
  CHECK(c.reconnect.timeout_seconds == 5);
}

TEST_CASE("membership keys and bounded staleness read into the sync settings") {
  DeploymentConfig c = parse(
      "mode: bounded\nworkers: 4\nstaleness: 3\nshards: [{listen: 127.0.0.1:7000}]\n"
      "sync: {min_workers: 2, lease_seconds: 2.5}\n");
  CHECK(c.mode == Mode::bounded);
  CHECK(c.steps.staleness == 3);
  CHECK(c.steps.min_workers == 2);
  CHECK(c.steps.lease_seconds == 2.5);
  DeploymentConfig plain = parse("shards: [{listen: 127.0.0.1:7000}]\n");
  CHECK(plain.steps.min_workers == 0);    // all of the job's workers
  CHECK(plain.steps.lease_seconds == 0);  // leases never end
  CHECK(error_of("workers: 2\nshards: [{listen: 127.0.0.1:7000}]\nsync: {min_workers: 3}\n") ==
        "configs/x.yaml:3: sync.min_workers: 3 is more than the job's 2 workers");
  CHECK(error_of("mode: sync\nstaleness: 2\nshards: [{listen: 127.0.0.1:7000}]\n") ==
        "configs/x.yaml:2: staleness: is only for mode: bounded");
}

TEST_CASE("without a checkpoint section nothing persists and sync waits forever") {
  DeploymentConfig c = parse("shards: [{listen: 127.0.0.1:7000}]\n");
  CHECK(c.checkpoint.directory.empty());
  CHECK(c.steps.timeout_seconds == 0);
  CHECK(c.steps.on_timeout == TimeoutAction::fail);
}

TEST_CASE("a checkpoint section needs a directory and non-negative seconds") {
  CHECK(error_of("shards: [{listen: 127.0.0.1:7000}]\ncheckpoint: {interval_seconds: 3}\n")
            .find("checkpoint.directory: missing") != std::string::npos);
  CHECK(error_of("shards: [{listen: 127.0.0.1:7000}]\nsync: {timeout_seconds: -1}\n")
            .find("sync.timeout_seconds: -1 is negative") != std::string::npos);
  CHECK(error_of("shards: [{listen: 127.0.0.1:7000}]\nsync: {on_timeout: wait}\n")
            .find("'wait' is not one of: fail, proceed") != std::string::npos);
}

TEST_CASE("a token_file that is a directory names the key and the path") {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "secret");
  CHECK_THROWS_WITH_AS(
      parse_deployment(kOneShard + "auth: {token_file: secret}\n", dir.path() / "d.yaml"),
      (dir.path().string() + "/d.yaml:3: auth.token_file: '" + (dir.path() / "secret").string() +
       "' is a directory")
          .c_str(),
      Error);
}

TEST_CASE("without a tls section the shards speak plain TCP") {
  CHECK_FALSE(parse(kOneShard).tls.has_value());
}

TEST_CASE(
    "tls files are resolved against the YAML file's folder and remember where they were named") {
  DeploymentConfig config =
      parse_deployment(kOneShard +
                           "tls:\n  cert_file: shard.pem\n  key_file: /keys/shard.key\n"
                           "  ca_file: ca.pem\n",
                       "/etc/psched/d.yaml");
  REQUIRE(config.tls.has_value());
  CHECK(config.tls->cert_file.path == "/etc/psched/shard.pem");
  CHECK(config.tls->cert_file.origin == "/etc/psched/d.yaml:4: tls.cert_file");
  CHECK(config.tls->key_file.path == "/keys/shard.key");
  CHECK(config.tls->ca_file.path == "/etc/psched/ca.pem");
  CHECK(config.tls->ca_file.origin == "/etc/psched/d.yaml:6: tls.ca_file");
  CHECK(config.tls->server_name.empty());
  CHECK(parse(kOneShard + "tls: {cert_file: a, key_file: b, ca_file: c, server_name: psched}\n")
            .tls->server_name == "psched");
}

TEST_CASE("a tls section needs its three files and no other keys") {
  CHECK(error_of(kOneShard + "tls: {cert_file: a, key_file: b}\n") ==
        "configs/x.yaml:3: tls.ca_file: missing (expected the CA that workers trust, PEM)");
  CHECK(error_of(kOneShard + "tls: {cert_file: a, key_file: b, ca_file: ''}\n") ==
        "configs/x.yaml:3: tls.ca_file: is empty (expected a file name)");
  CHECK(error_of(kOneShard + "tls:\n  cert_file: a\n  key_file: b\n  ca_file: c\n  verify: no\n")
            .starts_with("configs/x.yaml:7: tls.verify: unknown key (expected one of: cert_file, "
                         "key_file, ca_file, server_name)"));
}

TEST_CASE("optimizer settings that validate rejects name the optimizer section's line") {
  std::string message = error_of(kOneShard + "optimizer:\n  kind: sgd\n  lr: -1\n");
  CHECK(message.starts_with("configs/x.yaml:3: optimizer: "));
  CHECK(message.find("lr") != std::string::npos);
}

TEST_CASE("malformed YAML names the line and yaml-cpp's message") {
  CHECK(error_of("mode: async\nworkers: 2\n  bad: x\n" + kOneShard) ==
        "configs/x.yaml:3: malformed YAML: illegal map value");
  CHECK(error_of("mode: async\nworkers: 2\nshards: ]\n") ==
        "configs/x.yaml:3: malformed YAML: illegal flow end");
  CHECK(error_of("mode: async\nworkers: @2\n") ==
        "configs/x.yaml:2: malformed YAML: unknown token");
}

TEST_CASE("a document that is not a map is an error") {
  CHECK(error_of("- a\n- b\n")
            .starts_with("configs/x.yaml:1: expected a map with keys from: mode, "));
}

TEST_CASE("a missing deployment file is an error naming the path") {
  CHECK_THROWS_WITH_AS(load_deployment("configs/no_such_file.yaml"),
                       "configs/no_such_file.yaml: cannot open the deployment file: No such file "
                       "or directory",
                       Error);
  TempDir dir;
  CHECK_THROWS_WITH_AS(load_deployment(dir.path()), doctest::Contains("it is a directory"), Error);
}

}  // namespace
}  // namespace psched
