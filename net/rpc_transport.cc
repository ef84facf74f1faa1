#include "net/rpc_transport.h"

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

void RpcTransport::carry(const PartitionTask& task, TaskCallbacks callbacks) {
  ShardLink& link = *links_.at(task.shard.value);
  auto push = link.push(task.shard_variable, task.step, task.range, task.dtype,
                        {task.gradient, task.bytes});
  // Sent now; if the push is rejected the poll is dropped with it, which cancels it.
  auto poll = link.poll(task.shard_variable, task.step, task.range, task.fresh_value, task.bytes);
  TaskDone done = std::move(callbacks.done);
  tasks_.add(push.then([this, poll = kj::mv(poll), credit_free = callbacks.credit_free]() mutable {
                   if (free_credit_on_receipt_) credit_free();
                   return kj::mv(poll);
                 })
                 .then([done] { done(nullptr); },
                       [done](kj::Exception&& e) {
                         done(std::make_exception_ptr(from_kj_exception(e)));
                       }));
}

void RpcTransport::taskFailed(kj::Exception&& exception) {
  log_error("transport: {}", exception.getDescription().cStr());
}

}  // namespace psched
