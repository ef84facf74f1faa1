// SPDX-License-Identifier: Apache-2.0
#include "tests/cluster.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "net/tls.h"

namespace psched::testing {

DeploymentConfig cluster_config(uint32_t shards, uint32_t workers, Mode mode) {
  DeploymentConfig config;
  config.source = "in-process cluster";
  config.mode = mode;
  config.workers = workers;
  for (uint32_t i = 0; i < shards; ++i)
    config.shards.push_back({ListenAddress{"pipe", static_cast<uint16_t>(1000 + i)}});
  return config;
}

TlsConfig test_tls_config(const std::string& ca_file) {
  const std::filesystem::path dir = std::filesystem::path(PSCHED_SOURCE_DIR) / "tests/tls";
  auto file = [&](const std::string& name, const std::string& key) {
    return ConfigFile{.path = dir / name, .origin = "in-process cluster: tls." + key};
  };
  return {.cert_file = file("server.pem", "cert_file"),
          .key_file = file("server.key", "key_file"),
          .ca_file = file(ca_file, "ca_file"),
          .server_name = {}};
}

DataPathKind default_data_path() {
  const char* chosen = std::getenv("PSCHED_TEST_DATA_PATH");
  if (chosen == nullptr || std::string_view(chosen) == "stream") return DataPathKind::stream;
  if (std::string_view(chosen) == "calls") return DataPathKind::calls;
  throw std::invalid_argument(
      fmt::format("PSCHED_TEST_DATA_PATH={}: expected stream or calls", chosen));
}

Cluster::Cluster(DeploymentConfig config, DataPathKind data_path)
    : config_(std::move(config)), data_path_(data_path), scope_(loop_) {
  std::vector<ShardId> all;
  for (uint32_t i = 0; i < config_.shards.size(); ++i) all.push_back(ShardId(i));
  host_ = std::make_unique<ShardHost>(config_, all, actors_);
  if (config_.tls) client_tls_ = client_tls_context(*config_.tls);
}

Cluster::~Cluster() {
  workers_.clear();
  raw_links_.clear();
  run(host_->shut_down());
  settle();
  host_.reset();
}

Worker& Cluster::add_worker(WorkerId id, SchedulerConfig scheduler, const std::string& token) {
  std::vector<kj::Own<ShardLink>> links;
  auto& plans = cuts_.emplace_back();
  ReconnectPolicy policy{.timer = &timer_};
  for (uint32_t s = 0; s < config_.shards.size(); ++s) {
    auto plan = plans.emplace_back(std::make_shared<CutPlan>());
    StreamOpener open = [this, s, plan] { return open_stream(s, plan); };
    links.push_back(kj::heap<ShardLink>(config_.shards[s].listen.to_string(), open,
                                        config_.limits.max_message_bytes, policy,
                                        data_path_ == DataPathKind::stream));
  }
  auto worker =
      std::make_unique<Worker>(actors_, kj::mv(links), WorkerOptions{id, token, scheduler});
  run(worker->connect());
  workers_.push_back(std::move(worker));
  return *workers_.back();
}

std::shared_ptr<CutPlan> Cluster::cut(size_t worker, uint32_t shard, uint64_t after_bytes) {
  auto plan = cuts_.at(worker).at(shard);
  plan->bytes_left = after_bytes;
  return plan;
}

void Cluster::tick() {
  timer_.advanceTo(timer_.now() + kj::MILLISECONDS);
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Cluster::open_stream(uint32_t shard,
                                                             std::shared_ptr<CutPlan> plan) {
  auto pipe = kj::newTwoWayPipe();
  host_->listener(shard).serve(kj::mv(pipe.ends[0]));
  kj::Own<kj::AsyncIoStream> stream = kj::heap<CuttingStream>(kj::mv(pipe.ends[1]), plan);
  if (!client_tls_) return kj::mv(stream);
  std::string address = config_.shards[shard].listen.to_string();
  return tls_client_handshake(*client_tls_, kj::mv(stream), address,
                              expected_server_name(*config_.tls, address));
}

ShardLink& Cluster::open_link(uint32_t shard, uint64_t max_message_bytes) {
  auto pipe = kj::newTwoWayPipe();
  host_->listener(shard).serve(kj::mv(pipe.ends[0]));
  raw_links_.push_back(kj::heap<ShardLink>(
      kj::mv(pipe.ends[1]),
      max_message_bytes ? max_message_bytes : config_.limits.max_message_bytes));
  return *raw_links_.back();
}

ShardLink& Cluster::open_reconnecting_link(uint32_t shard, std::shared_ptr<CutPlan> plan,
                                           std::optional<uint32_t> later) {
  auto connections = std::make_shared<uint64_t>(0);
  StreamOpener open = [this, shard, plan, later, connections] {
    // A link opens its data stream beside each connection: the second pair of opens on.
    const bool first = (*connections)++ < (data_path_ == DataPathKind::stream ? 2u : 1u);
    return open_stream(first ? shard : later.value_or(shard), plan);
  };
  raw_links_.push_back(kj::heap<ShardLink>(
      config_.shards[shard].listen.to_string(), open, config_.limits.max_message_bytes,
      ReconnectPolicy{.timer = &timer_}, data_path_ == DataPathKind::stream));
  return *raw_links_.back();
}

kj::Promise<void> Cluster::open_data_stream(ShardLink& link, uint32_t shard) {
  auto pipe = kj::newTwoWayPipe();
  host_->listener(shard).serve(kj::mv(pipe.ends[0]));
  return link.open_data_stream(kj::mv(pipe.ends[1]));
}

void Cluster::drop_link(ShardLink& link) {
  std::erase_if(raw_links_, [&](const kj::Own<ShardLink>& l) { return l.get() == &link; });
}

void Cluster::run_until(const std::function<bool()>& done) {
  for (size_t turn = 0; turn < kMaxTurns; ++turn) {
    if (done()) return;
    scope_.poll();
    if (!done()) tick();
  }
  stalled();
}

void Cluster::settle() {
  scope_.poll();  // runs until nothing is left to do
}

void Cluster::stalled() {
  throw std::runtime_error("the simulated cluster stalled: the awaited event never happened");
}

}  // namespace psched::testing
