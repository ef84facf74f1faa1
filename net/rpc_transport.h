// RpcTransport: carries scheduled partitions over the shard links. start() may be called from
// any thread (the scheduler's strand); the calls are made on the KJ thread through the mailbox.
// The push and the poll of a partition are sent back to back (the poll does not wait for the
// push's receipt), so a partition costs one round trip. Fused partitions travel as one
// pushFused and one pollFused message.
#pragma once

#include <memory>
#include <vector>

#include "actors/partition_task.h"
#include "net/kj_mailbox.h"
#include "net/shard_link.h"

namespace psched {

class RpcTransport final : public PartitionTransport, private kj::TaskSet::ErrorHandler {
 public:
  // Built on the KJ thread. `links[i]` is shard i; the links and mailbox outlive the transport.
  RpcTransport(KjMailbox& mailbox, std::vector<ShardLink*> links);
  ~RpcTransport() noexcept override;

  void start(const PartitionTask& task, TaskCallbacks callbacks) override;
  void start_fused(std::vector<PartitionTask> tasks, std::vector<TaskCallbacks> callbacks) override;

 private:
  struct Carried;
  struct CarriedGroup;

  // On the KJ thread. One attempt at carrying; on a lost connection, the next once the link
  // has recovered.
  kj::Promise<void> attempt(std::shared_ptr<Carried> carried);
  kj::Promise<void> attempt_fused(std::shared_ptr<CarriedGroup> group);
  void taskFailed(kj::Exception&& exception) override;

  KjMailbox& mailbox_;
  std::vector<ShardLink*> links_;
  kj::TaskSet tasks_;
};

}  // namespace psched
