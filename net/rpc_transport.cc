#include "net/rpc_transport.h"

#include "common/check.h"
#include "common/log.h"
#include "net/wire_convert.h"

namespace psched {

RpcTransport::RpcTransport(KjMailbox& mailbox, std::vector<ShardLink*> links)
    : mailbox_(mailbox), links_(std::move(links)), tasks_(*this) {}

RpcTransport::~RpcTransport() noexcept = default;

void RpcTransport::start(const PartitionTask& task, TaskCallbacks callbacks) {
  mailbox_.post([this, task, callbacks = std::move(callbacks)]() mutable {
    carry(task, std::move(callbacks));
  });
}

void RpcTransport::start_fused(std::vector<PartitionTask> tasks,
                               std::vector<TaskCallbacks> callbacks) {
  mailbox_.post([this, tasks = std::move(tasks), callbacks = std::move(callbacks)]() mutable {
    carry_fused(tasks, std::move(callbacks));
  });
}

void RpcTransport::carry(const PartitionTask& task, TaskCallbacks callbacks) {
  ShardLink& link = *links_.at(task.shard.value);
  auto push = link.push(task.shard_variable, task.step, task.range, task.dtype,
                        {task.gradient, task.bytes});
  // Sent now; if the push is rejected the poll is dropped with it, which cancels it.
  auto poll = link.poll(task.shard_variable, task.step, task.range, task.fresh_value, task.bytes);
  TaskDone done = std::move(callbacks.done);
  auto applied = std::move(callbacks.applied);
  tasks_.add(
      push.then([poll = kj::mv(poll), receipt = std::move(callbacks.receipt)]() mutable {
            receipt();
            return kj::mv(poll);
          })
          .then(
              [done, applied](int64_t applied_at_ns) {
                if (applied) applied(applied_at_ns);
                done(nullptr);
              },
              [done](kj::Exception&& e) { done(std::make_exception_ptr(from_kj_exception(e))); }));
}

void RpcTransport::carry_fused(const std::vector<PartitionTask>& tasks,
                               std::vector<TaskCallbacks> callbacks) {
  ShardLink& link = *links_.at(tasks.front().shard.value);
  std::vector<FusedPartition> parts;
  for (const PartitionTask& t : tasks) {
    PSCHED_REQUIRE(t.shard == tasks.front().shard, t.id);
    parts.push_back(
        {t.shard_variable, t.step, t.range, t.dtype, {t.gradient, t.bytes}, t.fresh_value});
  }
  auto push = link.push_fused(parts);
  auto poll = link.poll_fused(parts);
  // Shared by both halves; each task's `done` runs exactly once: at a rejected push, else at
  // its poll's answer, else when the call as a whole fails.
  auto shared = std::make_shared<std::vector<TaskCallbacks>>(std::move(callbacks));
  auto finish = [shared](size_t i, std::exception_ptr error) {
    TaskDone done = std::move((*shared)[i].done);
    (*shared)[i].done = nullptr;
    if (done) done(error);
  };
  auto fail_all = [shared, finish](kj::Exception&& e) {
    auto error = std::make_exception_ptr(from_kj_exception(e));
    for (size_t i = 0; i < shared->size(); ++i) finish(i, error);
  };
  tasks_.add(push.then([shared, finish,
                        poll = kj::mv(poll)](std::vector<std::exception_ptr> receipts) mutable {
                   for (size_t i = 0; i < receipts.size(); ++i) {
                     if (receipts[i])
                       finish(i, receipts[i]);
                     else
                       (*shared)[i].receipt();
                   }
                   return kj::mv(poll);
                 })
                 .then(
                     [shared, finish](std::vector<PollOutcome> outcomes) {
                       for (size_t i = 0; i < outcomes.size(); ++i) {
                         if (!outcomes[i].error && (*shared)[i].applied)
                           (*shared)[i].applied(outcomes[i].applied_at_ns);
                         finish(i, outcomes[i].error);
                       }
                     },
                     fail_all));
}

void RpcTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
