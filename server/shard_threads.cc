// SPDX-License-Identifier: Apache-2.0
#include "server/shard_threads.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"

namespace psched {

// One loop thread; its slots' hosts live on it.
struct ShardThreads::Group {
  LoopThread thread{"psched-shard"};
  size_t shards = 0;  // slots placed here
};

// One hosted shard. `host` and the timers' promises are built, used and dropped on the
// group's thread only.
struct ShardThreads::Slot {
  ShardId id;
  std::shared_ptr<const DeploymentConfig> config;  // the host refers to it
  Group* group = nullptr;
  std::optional<ShardLock> claim;  // training with a checkpoint directory
  std::unique_ptr<ShardHost> host;
  // The shard was restored (start()): only then does it hold state a final checkpoint may
  // write. A start refused for a damaged log or an unusable directory writes none.
  bool restored = false;
  kj::Promise<void> checkpointing = nullptr;
  kj::Promise<void> liveness = nullptr;
  kj::Promise<void> reloading = nullptr;
  kj::Promise<void> reloading_now = nullptr;  // reload()'s, the newest
};

namespace {

// Claims `id` for this process unless it serves read-only or keeps no checkpoint. False when
// another process holds it (`holder` says who).
bool claim(const DeploymentConfig& config, ShardId id, std::optional<ShardLock>& claim,
           std::string* holder) {
  if (config.checkpoint.directory.empty() || !config.serve.directory.empty()) return true;
  claim = ShardLock::try_take(config.checkpoint.directory, id, holder);
  return claim.has_value();
}

// Runs work(item) for every item at once, each on a thread of its own (each blocks on its
// shard's loop while the loops run side by side), and returns when all have.
template <typename Items, typename Work>
void side_by_side(Items& items, const Work& work) {
  std::vector<std::thread> threads;
  for (auto& item : items) threads.emplace_back([&work, &item] { work(item); });
  for (std::thread& thread : threads) thread.join();
}

}  // namespace

ShardThreads::ShardThreads(unsigned threads, unsigned apply_helpers) : apply_pool_(apply_helpers) {
  for (size_t g = 0; g < std::max(1u, threads); ++g) groups_.push_back(std::make_unique<Group>());
}

ShardThreads::ShardThreads(const DeploymentConfig& config, std::vector<ShardId> shards,
                           unsigned threads, unsigned apply_helpers)
    : apply_pool_(apply_helpers) {
  auto shared = std::make_shared<const DeploymentConfig>(config);
  if (shards.empty())
    for (uint32_t i = 0; i < shared->shards.size(); ++i) shards.push_back(ShardId(i));
  size_t count = std::clamp<size_t>(threads, 1, std::max<size_t>(1, shards.size()));
  for (size_t g = 0; g < count; ++g) groups_.push_back(std::make_unique<Group>());
  try {
    for (ShardId id : shards) {
      std::string holder;
      std::unique_ptr<Slot> slot = claimed(id, shared, &holder);
      if (!slot)
        fail(ErrorCode::bad_config,
             "shard {} is hosted by another process ({}, holding {}): stop it first, or give "
             "each process its own shards",
             id.value, holder, ShardLock::file_of(shared->checkpoint.directory, id).string());
      make_host(*slot);
      slots_.push_back(std::move(slot));
    }
  } catch (...) {
    stop();
    throw;
  }
}

ShardThreads::~ShardThreads() {
  stop();
}

std::unique_ptr<ShardThreads::Slot> ShardThreads::claimed(
    ShardId id, std::shared_ptr<const DeploymentConfig> config, std::string* holder) {
  auto slot = std::make_unique<Slot>();
  slot->id = id;
  slot->config = std::move(config);
  // A shard the file does not name is refused by its ShardHost, naming the file.
  if (id.value < slot->config->shards.size() && !claim(*slot->config, id, slot->claim, holder))
    return nullptr;
  slot->group = &**std::ranges::min_element(groups_, {}, [](const auto& g) { return g->shards; });
  slot->group->shards++;
  return slot;
}

void ShardThreads::make_host(Slot& slot) {
  slot.group->thread.call([&slot, this](kj::AsyncIoContext&) {
    slot.host = std::make_unique<ShardHost>(*slot.config, std::vector<ShardId>{slot.id},
                                            slot.group->thread.loop(), &apply_pool_);
  });
}

void ShardThreads::restore_slot(Slot& slot) {
  slot.group->thread.call(
      [&slot](auto&) { return slot.host->restore().then([&slot] { slot.restored = true; }); });
}

void ShardThreads::serve_slot(Slot& slot) {
  slot.group->thread.call([&slot](kj::AsyncIoContext& io) {
    kj::Timer& timer = io.provider->getTimer();
    slot.checkpointing = slot.host->keep_checkpointing(timer).eagerlyEvaluate(nullptr);
    slot.liveness = slot.host->keep_enforcing_deadlines(timer).eagerlyEvaluate(nullptr);
    slot.reloading = slot.host->keep_reloading(timer).eagerlyEvaluate(nullptr);
    return slot.host->listen(io.provider->getNetwork(), timer);
  });
}

void ShardThreads::start() {
  // Every shard restored before any listens: a start refused for one shard's files leaves
  // the others untouched by workers, and writes no final checkpoint of theirs.
  for (auto& slot : slots_) restore_slot(*slot);
  for (auto& slot : slots_) serve_slot(*slot);
}

void ShardThreads::stop_slot(Slot& slot, bool final_checkpoint) {
  slot.group->thread.call([&slot, final_checkpoint](kj::AsyncIoContext&) -> kj::Promise<void> {
    if (!slot.host) return kj::READY_NOW;
    auto drop_timers = [&slot] {  // on the loop, before the host they use goes
      slot.checkpointing = nullptr;
      slot.liveness = nullptr;
      slot.reloading = nullptr;
      slot.reloading_now = nullptr;
    };
    return slot.host->shut_down()
        .then([] { return kj::evalLast([] {}); })  // the abandoned polls' answers go out
        .then([&slot, final_checkpoint, drop_timers] {
          drop_timers();
          return final_checkpoint && slot.restored ? slot.host->checkpoint()
                                                   : kj::Promise<void>(kj::READY_NOW);
        })
        .catch_([&slot](kj::Exception&& e) {
          log_error("shard {}: stopping: {}", slot.id.value, e.getDescription().cStr());
        })
        .then([&slot, drop_timers] {
          drop_timers();
          slot.host.reset();
        });
  });
  slot.claim.reset();  // after the shard is gone: nothing of it writes any more
}

void ShardThreads::stop() {
  if (stopped_) return;
  stopped_ = true;
  side_by_side(slots_, [this](auto& slot) { stop_slot(*slot, /*final_checkpoint=*/true); });
  for (auto& group : groups_) group->thread.stop();
}

std::vector<ShardThreads::Hosting> ShardThreads::host(
    const std::vector<ShardId>& ids, std::shared_ptr<const DeploymentConfig> config) {
  PSCHED_REQUIRE(!stopped_);
  std::vector<Hosting> out(ids.size(), {Hosting::Outcome::hosted, {}});
  std::vector<std::pair<std::unique_ptr<Slot>, Hosting*>> starting;
  for (size_t i = 0; i < ids.size(); ++i) {
    PSCHED_REQUIRE(std::ranges::count(hosted(), ids[i]) == 0);
    PSCHED_REQUIRE(ids[i].value < config->shards.size());
    if (auto slot = claimed(ids[i], config, &out[i].why))
      starting.emplace_back(std::move(slot), &out[i]);
    else
      out[i].outcome = Hosting::Outcome::held;
  }
  // Each restore blocks its caller, not the loops: they run side by side on their threads.
  side_by_side(starting, [this](auto& start) {
    try {
      make_host(*start.first);
      restore_slot(*start.first);
      serve_slot(*start.first);
    } catch (const std::exception& e) {
      *start.second = {Hosting::Outcome::failed, e.what()};
    }
  });
  for (auto& [slot, result] : starting) {
    if (result->outcome == Hosting::Outcome::hosted) {
      slots_.push_back(std::move(slot));
      continue;
    }
    stop_slot(*slot, /*final_checkpoint=*/false);
    slot->group->shards--;
  }
  return out;
}

void ShardThreads::release(ShardId id) {
  auto found = std::ranges::find(slots_, id, [](const auto& slot) { return slot->id; });
  PSCHED_REQUIRE(found != slots_.end());
  stop_slot(**found, /*final_checkpoint=*/false);
  (*found)->group->shards--;
  slots_.erase(found);
}

void ShardThreads::reload() {
  for (auto& slot : slots_)
    slot->group->thread.loop().post([&slot = *slot] {
      if (slot.host) slot.reloading_now = slot.host->reload().eagerlyEvaluate(nullptr);
    });
}

void ShardThreads::start_tracing(size_t capacity) {
  for (auto& slot : slots_)
    slot->group->thread.call(
        [&slot = *slot, capacity](auto&) { slot.host->start_tracing(capacity); });
}

nlohmann::json ShardThreads::trace() {
  PSCHED_REQUIRE(!stopped_);
  nlohmann::json events = nlohmann::json::array();
  for (auto& slot : slots_) {
    slot->group->thread.call([&](auto&) {
      if (const ShardTrace* trace = slot->host->trace(0))
        trace->append_events(events, static_cast<int>(slot->id.value),
                             fmt::format("shard {}", slot->id.value));
    });
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

std::vector<ShardId> ShardThreads::hosted() const {
  std::vector<ShardId> out;
  for (const auto& slot : slots_) out.push_back(slot->id);
  return out;
}

VariableShard& ShardThreads::shard(size_t i) {
  return slots_.at(i)->host->shard(0);
}

const ShardListener& ShardThreads::listener(size_t i) {
  return slots_.at(i)->host->listener(0);
}

}  // namespace psched
