// SPDX-License-Identifier: Apache-2.0
#include "link/link_transport.h"

#include "common/check.h"
#include "common/kj_error.h"
#include "common/log.h"

namespace psched {
namespace {

bool connection_lost(const std::optional<Error>& error) {
  return error && category(error->code()) == ErrorCategory::disconnected;
}

}  // namespace

// Partitions of one message on their way, across attempts; each finishes on its own.
struct LinkTransport::Carried {
  std::vector<PartitionTask> tasks;
  std::vector<TaskCallbacks> callbacks;
  std::vector<bool> receipted, finished;

  void receipt(size_t i) {
    if (!receipted[i]) callbacks[i].receipt();
    receipted[i] = true;
  }
  void finish(size_t i, const std::optional<Error>& error) {
    if (!finished[i]) callbacks[i].done(error ? std::make_exception_ptr(*error) : nullptr);
    finished[i] = true;
  }
  void finish_all(const Error& error) {
    for (size_t i = 0; i < tasks.size(); ++i) finish(i, error);
  }
  std::vector<size_t> unfinished() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < tasks.size(); ++i)
      if (!finished[i]) out.push_back(i);
    return out;
  }
};

LinkTransport::LinkTransport(std::vector<ShardLink*> links)
    : links_(std::move(links)), tasks_(*this) {}

LinkTransport::~LinkTransport() noexcept = default;

bool LinkTransport::fuses(ShardId shard) const {
  return links_.at(shard.value)->fuses();
}

void LinkTransport::start(std::vector<PartitionTask> tasks, std::vector<TaskCallbacks> callbacks) {
  size_t n = tasks.size();
  tasks_.add(attempt(std::make_shared<Carried>(Carried{
      std::move(tasks), std::move(callbacks), std::vector<bool>(n), std::vector<bool>(n)})));
}

kj::Promise<std::vector<Outcome>> LinkTransport::send(std::shared_ptr<Carried> carried,
                                                      const std::vector<size_t>& live,
                                                      DataPath& path,
                                                      std::span<const PartitionRequest> parts) {
  if (!receipt_first_)
    return path.push_poll(parts).then([carried, live](std::vector<Outcome> outcomes) {
      for (size_t k = 0; k < live.size(); ++k)
        if (!outcomes[k].error) carried->receipt(live[k]);
      return outcomes;
    });
  auto pushed = path.push(parts);
  auto polled = path.poll(parts);  // sent now; dropped (so cancelled) when every push failed
  return pushed.then([carried, live, polled = kj::mv(polled)](std::vector<Outcome> receipts) mutable
                     -> kj::Promise<std::vector<Outcome>> {
    bool any = false;
    for (size_t k = 0; k < live.size(); ++k) {
      if (!receipts[k].error)
        carried->receipt(live[k]), any = true;
      else if (!connection_lost(receipts[k].error))
        carried->finish(live[k], receipts[k].error);
    }
    if (!any) return receipts;
    return kj::mv(polled);
  });
}

kj::Promise<void> LinkTransport::attempt(std::shared_ptr<Carried> carried) {
  std::vector<size_t> live = carried->unfinished();
  ShardId shard = carried->tasks[live.front()].shard;
  ShardLink& link = *links_.at(shard.value);
  uint64_t epoch = link.epoch();
  kj::Own<DataPath> path = link.data_path();
  if (!path) {
    carried->finish_all(
        Error(ErrorCode::invalid_argument, "push before connect: the shard session is not open"));
    return kj::READY_NOW;
  }
  std::vector<PartitionRequest> parts;
  for (size_t i : live) {
    const PartitionTask& t = carried->tasks[i];
    PSCHED_REQUIRE(t.shard == shard, t.id);
    parts.push_back(
        {t.shard_variable, t.step, t.range, t.dtype, {t.gradient, t.bytes}, t.fresh_value});
  }
  // A partition finishes at a refused push, else at its poll's answer; one lost with its
  // connection (or failed because the shard stopped) is carried again.
  auto sent = send(carried, live, *path, parts).attach(kj::mv(path));
  return sent.then([this, carried, live, &link, epoch](std::vector<Outcome> outcomes) {
    for (size_t k = 0; k < live.size(); ++k) {
      size_t i = live[k];
      if (carried->finished[i] || connection_lost(outcomes[k].error)) continue;
      if (!outcomes[k].error && carried->callbacks[i].applied)
        carried->callbacks[i].applied(outcomes[k].applied_at_ns);
      carried->finish(i, outcomes[k].error);
    }
    if (carried->unfinished().empty()) return kj::Promise<void>(kj::READY_NOW);
    return link.recover(epoch).then(
        [this, carried] { return attempt(carried); },
        [carried](kj::Exception&& e) { carried->finish_all(from_kj_exception(e)); });
  });
}

void LinkTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
