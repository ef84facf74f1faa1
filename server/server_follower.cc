// SPDX-License-Identifier: Apache-2.0
#include "server/server_follower.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

// How long a shard whose hosting failed (a restore refused, an address still bound) waits
// before the next try: each try restores the shard, which writes a checkpoint.
constexpr std::chrono::seconds kRetryAfterFailure{5};

// `config` without where its shards are hosted: what must not change while the servers run.
// The job's identity for shards with no checkpoint goes too: psched-server names a job by its
// shards' addresses unless --job names it, and a shard that moves has its checkpoint.
DeploymentConfig without_placement(DeploymentConfig config) {
  config.source.clear();
  config.file.clear();
  config.checkpoint.job = 0;
  for (ShardConfig& shard : config.shards) shard.listen = shard.http = {}, shard.server.clear();
  config.servers.clear();
  return config;
}

std::vector<uint32_t> indices(const std::vector<ShardId>& shards) {
  std::vector<uint32_t> out;
  for (ShardId id : shards) out.push_back(id.value);
  return out;
}

}  // namespace

ServerFollower::ServerFollower(std::string name, std::filesystem::path file,
                               std::optional<ListenAddress> control,
                               std::function<void(DeploymentConfig&)> adjust, ShardThreads& threads)
    : name_(std::move(name)),
      file_(std::move(file)),
      adjust_(std::move(adjust)),
      threads_(threads) {
  version_ = file_version(file_);
  auto config = std::make_shared<DeploymentConfig>(load_deployment(file_));
  adjust_(*config);
  if (config->servers.empty() || config->checkpoint.directory.empty() ||
      !config->checkpoint.update_log)
    fail(ErrorCode::bad_config,
         "{}: --server needs servers: and checkpoint.directory with update_log (a shard moves "
         "between servers through its checkpoint and update log, in a directory they share)",
         file_.string());
  const ServerConfig* me = find_server(*config, name_);
  if (me && control && *control != me->control)
    fail(ErrorCode::bad_config, "--control {}: {} gives server {} {}", control->to_string(),
         file_.string(), name_, me->control.to_string());
  if (!me && !control)
    fail(ErrorCode::bad_config,
         "{}: no server '{}' in servers: (a server joining the job needs --control HOST:PORT, "
         "then psched shards add)",
         file_.string(), name_);
  config_ = std::move(config);
  publish();
  const ListenAddress address = me ? me->control : *control;
  control_ = std::make_unique<HttpServer>(
      address, HttpRoutes{{"/server", [this](const HttpRequest&, HttpRespond respond) {
                             respond({.content_type = "application/json", .body = status().dump()});
                           }}});
  log_info("server {}: answering GET /server on {}; shards here: {}", name_, address.to_string(),
           fmt::join(indices(shards_of_server(*config_, name_)), " "));
}

ServerFollower::~ServerFollower() = default;

void ServerFollower::poll() {
  reread();
  release_unwanted();
  host_wanted();
  publish();
}

void ServerFollower::reread() {
  try {
    const FileVersion now = file_version(file_);
    if (version_ && *version_ == now) return;
    version_ = now;
    auto next = std::make_shared<DeploymentConfig>(load_deployment(file_));
    adjust_(*next);
    if (without_placement(*next) != without_placement(*config_))
      fail(ErrorCode::bad_config,
           "it changes more than where the shards are hosted (while the servers run, only "
           "servers: and the shards' listen, http and server may change; restart for the rest)");
    if (!find_server(*next, name_))
      log_warn("server {}: {} names it no more: it hosts none of the shards", name_,
               file_.string());
    config_ = std::move(next);
    for (auto& [shard, waiting] : waiting_) waiting.retry_at = {};  // the change may mend it
    log_info("server {}: {} changed; shards here: {}", name_, file_.string(),
             fmt::join(indices(shards_of_server(*config_, name_)), " "));
  } catch (const std::exception& e) {
    log_error("server {}: {} ignored: {}", name_, file_.string(), e.what());
  }
}

void ServerFollower::release_unwanted() {
  for (ShardId id : threads_.hosted()) {
    const ShardConfig& now = config_->shards[id.value];
    auto hosted = hosted_.find(id.value);
    if (now.server == name_ && hosted != hosted_.end() && hosted->second.as == now) continue;
    if (hosted != hosted_.end()) hosted_.erase(hosted);  // the monitor first: it uses the shard
    threads_.release(id);
    log_info("server {}: shard {} released; {} hosts it at {}", name_, id.value, now.server,
             now.listen.to_string());
  }
  std::erase_if(waiting_,
                [&](const auto& entry) { return config_->shards[entry.first].server != name_; });
}

void ServerFollower::host_wanted() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<ShardId> due;
  for (ShardId id : shards_of_server(*config_, name_)) {
    auto waiting = waiting_.find(id.value);
    if (!hosted_.contains(id.value) &&
        (waiting == waiting_.end() || now >= waiting->second.retry_at))
      due.push_back(id);
  }
  if (due.empty()) return;
  const std::vector<ShardThreads::Hosting> outcomes = threads_.host(due, config_);
  for (size_t i = 0; i < due.size(); ++i) {
    const ShardId id = due[i];
    std::string reason;
    switch (outcomes[i].outcome) {
      case ShardThreads::Hosting::Outcome::hosted:
        record_hosted(id);
        continue;
      case ShardThreads::Hosting::Outcome::held:
        reason = fmt::format("its previous server has not let it go yet ({})", outcomes[i].why);
        break;
      case ShardThreads::Hosting::Outcome::failed:
        reason =
            fmt::format("{} (trying again in {} s)", outcomes[i].why, kRetryAfterFailure.count());
        waiting_[id.value].retry_at = now + kRetryAfterFailure;
        break;
    }
    if (waiting_[id.value].reason != reason)
      log_info("server {}: shard {} waits: {}", name_, id.value, reason);
    waiting_[id.value].reason = std::move(reason);
  }
}

void ServerFollower::record_hosted(ShardId id) {
  waiting_.erase(id.value);
  Hosted& hosted = hosted_[id.value];
  hosted.config = config_;
  hosted.as = config_->shards[id.value];
  const std::vector<ShardId> all = threads_.hosted();
  const size_t i = static_cast<size_t>(std::ranges::find(all, id) - all.begin());
  try {
    hosted.monitor =
        std::make_unique<ShardMonitor>(threads_.shard(i), threads_.listener(i), *hosted.config, id);
  } catch (const std::exception& e) {
    log_error("server {}: shard {} serves without its operator view: {}", name_, id.value,
              e.what());
  }
  log_info("server {}: shard {} hosted, listening on {}", name_, id.value,
           hosted.as.listen.to_string());
}

void ServerFollower::publish() {
  nlohmann::json waiting = nlohmann::json::array();
  for (const auto& [shard, wait] : waiting_)
    waiting.push_back({{"shard", shard}, {"reason", wait.reason}});
  nlohmann::json status = {{"server", name_},
                           {"pid", ::getpid()},
                           {"file", file_.string()},
                           {"hosted", indices(threads_.hosted())},
                           {"waiting", std::move(waiting)}};
  std::lock_guard lock(status_mutex_);
  status_ = std::move(status);
}

nlohmann::json ServerFollower::status() const {
  std::lock_guard lock(status_mutex_);
  return status_;
}

}  // namespace psched
