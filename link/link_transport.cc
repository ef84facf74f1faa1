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
  struct Part {
    PartitionTask task;
    bool receipted = false;
    bool finished = false;
  };
  TaskReports* reports;
  std::vector<Part> parts;
  std::vector<size_t> live;  // the parts of the attempt on its way

  void receipt(size_t i) {
    if (!parts[i].receipted) reports->received(parts[i].task.id);
    parts[i].receipted = true;
  }
  void finish(size_t i, const std::optional<Error>& error, int64_t applied_at_ns = 0) {
    if (parts[i].finished) return;
    parts[i].finished = true;  // first: the report may start more tasks
    if (error)
      reports->finished(parts[i].task.id, *error);
    else
      reports->finished(parts[i].task.id, Landed{applied_at_ns});
  }
  void finish_all(const Error& error) {
    for (size_t i = 0; i < parts.size(); ++i) finish(i, error);
  }
  // Sets `live` to the unfinished parts; false when there are none.
  bool start_attempt() {
    live.clear();
    for (size_t i = 0; i < parts.size(); ++i)
      if (!parts[i].finished) live.push_back(i);
    return !live.empty();
  }
};

LinkTransport::LinkTransport(std::vector<ShardLink*> links)
    : links_(std::move(links)), tasks_(*this) {}

LinkTransport::~LinkTransport() noexcept = default;

void LinkTransport::start(PartitionTask task, TaskReports& reports) {
  auto carried = std::make_shared<Carried>();
  carried->reports = &reports;
  carried->parts.push_back({std::move(task)});
  if (carried->start_attempt()) tasks_.add(attempt(std::move(carried)));
}

kj::Promise<std::vector<Outcome>> LinkTransport::send(std::shared_ptr<Carried> carried,
                                                      DataPath& path,
                                                      std::span<const PartitionRequest> parts) {
  if (!receipt_first_)
    return path.push_poll(parts).then([carried](std::vector<Outcome> outcomes) {
      for (size_t k = 0; k < carried->live.size(); ++k)
        if (!outcomes[k].error) carried->receipt(carried->live[k]);
      return outcomes;
    });
  auto pushed = path.push(parts);
  auto polled = path.poll(parts);  // sent now; dropped (so cancelled) when every push failed
  return pushed.then([carried, polled = kj::mv(polled)](std::vector<Outcome> receipts) mutable
                     -> kj::Promise<std::vector<Outcome>> {
    bool any = false;
    for (size_t k = 0; k < carried->live.size(); ++k) {
      size_t i = carried->live[k];
      if (!receipts[k].error) {
        carried->receipt(i);
        any = true;
      } else if (!connection_lost(receipts[k].error)) {
        carried->finish(i, receipts[k].error);
      }
    }
    if (!any) return receipts;
    return kj::mv(polled);
  });
}

kj::Promise<void> LinkTransport::attempt(std::shared_ptr<Carried> carried) {
  ShardId shard = carried->parts[carried->live.front()].task.shard;
  ShardLink& link = *links_.at(shard.value);
  uint64_t epoch = link.epoch();
  DataPath* path = link.data_path();
  if (path == nullptr) {
    carried->finish_all(
        Error(ErrorCode::invalid_argument, "push before connect: the shard session is not open"));
    return kj::READY_NOW;
  }
  requests_.clear();  // read by the path before send() returns
  for (size_t i : carried->live) {
    const PartitionTask& t = carried->parts[i].task;
    PSCHED_REQUIRE(t.shard == shard, t.id);
    requests_.push_back({t.shard_variable,
                         t.step,
                         t.range,
                         t.dtype,
                         {t.gradient, t.bytes},
                         t.fresh_value,
                         t.format,
                         t.value_format});
  }
  // A partition finishes at a refused push, else at its poll's answer; one lost with its
  // connection (or failed because the shard stopped) is carried again.
  auto sent = send(carried, *path, requests_).attach(link.hold());
  return sent.then([this, carried, &link, epoch](std::vector<Outcome> outcomes) {
    for (size_t k = 0; k < carried->live.size(); ++k) {
      size_t i = carried->live[k];
      if (carried->parts[i].finished || connection_lost(outcomes[k].error)) continue;
      carried->finish(i, outcomes[k].error, outcomes[k].applied_at_ns);
    }
    if (!carried->start_attempt()) return kj::Promise<void>(kj::READY_NOW);
    return link.recover(epoch).then(
        [this, carried] { return attempt(carried); },
        [carried](kj::Exception&& e) { carried->finish_all(from_kj_exception(e)); });
  });
}

void LinkTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
