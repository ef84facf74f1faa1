// SPDX-License-Identifier: Apache-2.0
#include "server/shard_threads.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/log.h"

namespace psched {

// One loop thread and what lives on it. `host` and the timers' promises are built, used and
// dropped on that thread only.
struct ShardThreads::Group {
  std::vector<ShardId> shards;
  LoopThread thread{"psched-shard"};
  std::unique_ptr<ShardHost> host;
  // The host's shards were restored (start()): only then do they hold state a final checkpoint
  // may write. A start refused for a damaged log or an unusable directory writes none.
  bool restored = false;
  kj::Promise<void> checkpointing = nullptr;
  kj::Promise<void> liveness = nullptr;
  kj::Promise<void> reloading = nullptr;
  kj::Promise<void> reloading_now = nullptr;  // reload()'s, the newest
};

ShardThreads::ShardThreads(const DeploymentConfig& config, std::vector<ShardId> shards,
                           unsigned threads, unsigned apply_helpers)
    : config_(config), apply_pool_(apply_helpers) {
  if (shards.empty())
    for (uint32_t i = 0; i < config_.shards.size(); ++i) shards.push_back(ShardId(i));
  size_t count = std::clamp<size_t>(threads, 1, std::max<size_t>(1, shards.size()));
  for (size_t g = 0; g < count; ++g) groups_.push_back(std::make_unique<Group>());
  for (size_t i = 0; i < shards.size(); ++i) {
    Group& group = *groups_[i % count];
    placed_.push_back({&group, group.shards.size()});
    group.shards.push_back(shards[i]);
  }
  try {
    for (auto& group : groups_)
      group->thread.call([&group = *group, this](kj::AsyncIoContext&) {
        group.host =
            std::make_unique<ShardHost>(config_, group.shards, group.thread.loop(), &apply_pool_);
      });
  } catch (...) {
    stop();
    throw;
  }
}

ShardThreads::~ShardThreads() {
  stop();
}

void ShardThreads::start() {
  for (auto& group : groups_)
    group->thread.call([&group = *group](auto&) {
      return group.host->restore().then([&group] { group.restored = true; });
    });
  for (auto& group : groups_) {
    group->thread.call([&group = *group](kj::AsyncIoContext& io) {
      kj::Timer& timer = io.provider->getTimer();
      group.checkpointing = group.host->keep_checkpointing(timer).eagerlyEvaluate(nullptr);
      group.liveness = group.host->keep_enforcing_deadlines(timer).eagerlyEvaluate(nullptr);
      group.reloading = group.host->keep_reloading(timer).eagerlyEvaluate(nullptr);
      return group.host->listen(io.provider->getNetwork(), timer);
    });
  }
}

void ShardThreads::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& group : groups_) {
    group->thread.call([&group = *group](kj::AsyncIoContext&) -> kj::Promise<void> {
      if (!group.host) return kj::READY_NOW;
      return group.host->shut_down()
          .then([] { return kj::evalLast([] {}); })  // the abandoned polls' answers go out
          .then([&group] {
            group.checkpointing = nullptr;
            group.liveness = nullptr;
            group.reloading = nullptr;
            group.reloading_now = nullptr;
            return group.restored ? group.host->checkpoint() : kj::Promise<void>(kj::READY_NOW);
          })
          .then([&group] { group.host.reset(); },
                [&group](kj::Exception&& e) {
                  log_error("final checkpoint failed: {}", e.getDescription().cStr());
                  group.host.reset();
                });
    });
  }
  for (auto& group : groups_) group->thread.stop();
}

void ShardThreads::reload() {
  for (auto& group : groups_)
    group->thread.loop().post([&group = *group] {
      if (group.host) group.reloading_now = group.host->reload().eagerlyEvaluate(nullptr);
    });
}

void ShardThreads::start_tracing(size_t capacity) {
  for (auto& group : groups_)
    group->thread.call([&group = *group, capacity](auto&) { group.host->start_tracing(capacity); });
}

nlohmann::json ShardThreads::trace() {
  PSCHED_REQUIRE(!stopped_);
  nlohmann::json events = nlohmann::json::array();
  for (const Placed& placed : placed_) {
    ShardId id = placed.group->shards[placed.index];
    placed.group->thread.call([&](auto&) {
      if (const ShardTrace* trace = placed.group->host->trace(placed.index))
        trace->append_events(events, static_cast<int>(id.value), fmt::format("shard {}", id.value));
    });
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

VariableShard& ShardThreads::shard(size_t i) {
  return placed_.at(i).group->host->shard(placed_[i].index);
}

const ShardListener& ShardThreads::listener(size_t i) {
  return placed_.at(i).group->host->listener(placed_[i].index);
}

}  // namespace psched
