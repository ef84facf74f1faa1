// SPDX-License-Identifier: Apache-2.0
#include "link/rpc_transport.h"

#include "common/check.h"
#include "common/log.h"
#include "net/wire_convert.h"

namespace psched {

namespace {

bool connection_lost(const kj::Exception& e) {
  return e.getType() == kj::Exception::Type::DISCONNECTED;
}

bool connection_lost(std::exception_ptr error) {
  return category(to_error(error).code()) == ErrorCategory::disconnected;
}

std::exception_ptr error_of(const kj::Exception& e) {
  return std::make_exception_ptr(from_kj_exception(e));
}

}  // namespace

// One partition on its way, across attempts.
struct RpcTransport::Carried {
  PartitionTask task;
  TaskCallbacks callbacks;
  bool receipted = false;

  void receipt() {
    if (!receipted) callbacks.receipt();
    receipted = true;
  }
};

// Fused partitions on their way, across attempts; each finishes on its own.
struct RpcTransport::CarriedGroup {
  std::vector<PartitionTask> tasks;
  std::vector<TaskCallbacks> callbacks;
  std::vector<bool> receipted, finished;

  void receipt(size_t i) {
    if (!receipted[i]) callbacks[i].receipt();
    receipted[i] = true;
  }
  void finish(size_t i, std::exception_ptr error) {
    if (!finished[i]) callbacks[i].done(error);
    finished[i] = true;
  }
  void finish_all(std::exception_ptr error) {
    for (size_t i = 0; i < tasks.size(); ++i) finish(i, error);
  }
  std::vector<size_t> unfinished() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < tasks.size(); ++i)
      if (!finished[i]) out.push_back(i);
    return out;
  }
};

RpcTransport::RpcTransport(std::vector<ShardLink*> links)
    : links_(std::move(links)), tasks_(*this) {}

RpcTransport::~RpcTransport() noexcept = default;

void RpcTransport::start(const PartitionTask& task, TaskCallbacks callbacks) {
  tasks_.add(attempt(std::make_shared<Carried>(Carried{task, std::move(callbacks)})));
}

void RpcTransport::start_fused(std::vector<PartitionTask> tasks,
                               std::vector<TaskCallbacks> callbacks) {
  size_t n = tasks.size();
  tasks_.add(attempt_fused(std::make_shared<CarriedGroup>(CarriedGroup{
      std::move(tasks), std::move(callbacks), std::vector<bool>(n), std::vector<bool>(n)})));
}

kj::Promise<int64_t> RpcTransport::send(std::shared_ptr<Carried> c, ShardLink& link) {
  const PartitionTask& task = c->task;
  std::span<const std::byte> gradient{task.gradient, task.bytes};
  if (!receipt_first_)
    return link
        .push_poll(task.shard_variable, task.step, task.range, task.dtype, gradient,
                   task.fresh_value, task.bytes)
        .then([c](int64_t applied_at_ns) {
          c->receipt();
          return applied_at_ns;
        });
  auto push = link.push(task.shard_variable, task.step, task.range, task.dtype, gradient);
  // Sent now; if the push is rejected the poll is dropped with it, which cancels it.
  auto poll = link.poll(task.shard_variable, task.step, task.range, task.fresh_value, task.bytes);
  return push.then([c, poll = kj::mv(poll)]() mutable {
    c->receipt();
    return kj::mv(poll);
  });
}

kj::Promise<void> RpcTransport::attempt(std::shared_ptr<Carried> c) {
  ShardLink& link = *links_.at(c->task.shard.value);
  uint64_t epoch = link.epoch();
  return send(c, link).then(
      [c](int64_t applied_at_ns) -> kj::Promise<void> {
        if (c->callbacks.applied) c->callbacks.applied(applied_at_ns);
        c->callbacks.done(nullptr);
        return kj::READY_NOW;
      },
      [this, c, &link, epoch](kj::Exception&& e) -> kj::Promise<void> {
        if (!connection_lost(e)) {
          c->callbacks.done(error_of(e));
          return kj::READY_NOW;
        }
        return link.recover(epoch).then([this, c] { return attempt(c); },
                                        [c](kj::Exception&& e) { c->callbacks.done(error_of(e)); });
      });
}

kj::Promise<std::vector<PollOutcome>> RpcTransport::send_fused(
    std::shared_ptr<CarriedGroup> group, const std::vector<size_t>& live, ShardLink& link,
    std::span<const FusedPartition> parts) {
  if (!receipt_first_)
    return link.push_poll_fused(parts).then([group, live](std::vector<PollOutcome> outcomes) {
      for (size_t k = 0; k < live.size(); ++k)
        if (!outcomes[k].error) group->receipt(live[k]);
      return outcomes;
    });
  auto push = link.push_fused(parts);
  auto poll = link.poll_fused(parts);
  return push.then(
      [group, live, poll = kj::mv(poll)](std::vector<std::exception_ptr> receipts) mutable {
        for (size_t k = 0; k < live.size(); ++k)
          receipts[k] ? group->finish(live[k], receipts[k]) : group->receipt(live[k]);
        return kj::mv(poll);
      });
}

kj::Promise<void> RpcTransport::attempt_fused(std::shared_ptr<CarriedGroup> group) {
  std::vector<size_t> live = group->unfinished();
  ShardLink& link = *links_.at(group->tasks[live.front()].shard.value);
  uint64_t epoch = link.epoch();
  std::vector<FusedPartition> parts;
  for (size_t i : live) {
    const PartitionTask& t = group->tasks[i];
    PSCHED_REQUIRE(t.shard == group->tasks[live.front()].shard, t.id);
    parts.push_back(
        {t.shard_variable, t.step, t.range, t.dtype, {t.gradient, t.bytes}, t.fresh_value});
  }
  // A partition finishes at a rejected push, else at its poll's answer; a poll that failed
  // because the shard stopped is carried again, as is everything when the call was lost.
  auto carried =
      send_fused(group, live, link, parts).then([group, live](std::vector<PollOutcome> outcomes) {
        for (size_t k = 0; k < live.size(); ++k) {
          size_t i = live[k];
          if (group->finished[i] || (outcomes[k].error && connection_lost(outcomes[k].error)))
            continue;
          if (!outcomes[k].error && group->callbacks[i].applied)
            group->callbacks[i].applied(outcomes[k].applied_at_ns);
          group->finish(i, outcomes[k].error);
        }
      });
  auto again = [this, group, &link, epoch]() -> kj::Promise<void> {
    if (group->unfinished().empty()) return kj::READY_NOW;
    return link.recover(epoch).then([this, group] { return attempt_fused(group); },
                                    [group](kj::Exception&& e) { group->finish_all(error_of(e)); });
  };
  return carried.then(kj::cp(again),
                      [group, again](kj::Exception&& e) mutable -> kj::Promise<void> {
                        if (connection_lost(e)) return again();
                        group->finish_all(error_of(e));
                        return kj::READY_NOW;
                      });
}

void RpcTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
