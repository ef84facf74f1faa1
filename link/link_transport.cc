// SPDX-License-Identifier: Apache-2.0
#include "link/link_transport.h"

#include "common/kj_error.h"
#include "common/log.h"

namespace psched {

// One task on its way, across attempts: what the transport needs of it until it is finished.
struct LinkTransport::Carried {
  PartitionTask task;  // owns the gradient when compressed
  TaskReports& reports;
  bool receipted = false;  // reported; a resend's receipt is not reported again

  void receipt() {
    if (!receipted) reports.received(task.id);
    receipted = true;
  }
  void finish(TaskOutcome outcome) { reports.finished(task.id, std::move(outcome)); }
};

LinkTransport::LinkTransport(std::vector<ShardLink*> links)
    : links_(std::move(links)), tasks_(*this) {}

LinkTransport::~LinkTransport() noexcept = default;

void LinkTransport::start(PartitionTask task, TaskReports& reports) {
  auto carried = kj::heap<Carried>(Carried{std::move(task), reports});
  Carried& on_its_way = *carried;
  tasks_.add(attempt(on_its_way).attach(kj::mv(carried)));
}

kj::Promise<Landed> LinkTransport::send(Carried& carried, DataPath& path) {
  if (std::holds_alternative<RowsRequest>(carried.task.request)) return send_rows(carried, path);
  const PartitionRequest& part = carried.task.partition();
  if (!receipt_first_)
    return path.push_poll(part).then([&carried](Landed value) {
      carried.receipt();
      return value;
    });
  auto pushed = path.push(part);
  auto polled = path.poll(part);  // sent now; dropped (so cancelled) when the push failed
  return pushed.then([&carried, polled = kj::mv(polled)]() mutable {
    carried.receipt();
    return kj::mv(polled);
  });
}

kj::Promise<Landed> LinkTransport::send_rows(Carried& carried, DataPath& path) {
  const RowsRequest& rows = std::get<RowsRequest>(carried.task.request);
  if (rows.push)
    return path.push_rows(rows).then([&carried] {
      carried.receipt();
      return Landed{};
    });
  // A pull's request is out: what a receipt says of a push (sync mode frees its credit, as the
  // rows wait for every worker's push).
  auto answered = path.pull_rows(rows);
  carried.receipt();
  return answered;
}

kj::Promise<void> LinkTransport::attempt(Carried& carried) {
  ShardLink& link = *links_.at(carried.task.shard.value);
  uint64_t epoch = link.epoch();
  DataPath* path = link.data_path();
  if (path == nullptr) {
    carried.finish(
        Error(ErrorCode::invalid_argument, "push before connect: the shard session is not open"));
    return kj::READY_NOW;
  }
  // The task finishes at a refused push, else at its poll's answer; one lost with its
  // connection (or failed because the shard stopped) is carried again.
  auto sent = send(carried, *path).attach(link.hold());
  return sent.then(
      [&carried](Landed value) -> kj::Promise<void> {
        carried.finish(value);
        return kj::READY_NOW;
      },
      [this, &carried, &link, epoch](kj::Exception&& e) -> kj::Promise<void> {
        Error error = from_kj_exception(e);
        if (category(error.code()) != ErrorCategory::disconnected) {
          carried.finish(error);
          return kj::READY_NOW;
        }
        return link.recover(epoch, error.what())
            .then([this, &carried] { return attempt(carried); },
                  [&carried](kj::Exception&& e) { carried.finish(from_kj_exception(e)); });
      });
}

void LinkTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
