// RpcTransport: carries scheduled partitions over the shard links. It lives on the worker's
// loop with the scheduler and the links: start() sends at once, with no hop. The push and
// the poll of a partition are sent back to back (the poll does not wait for the
// push's receipt), so a partition costs one round trip. Fused partitions travel as one
// pushFused and one pollFused message.
#pragma once

#include <memory>
#include <vector>

#include "actors/partition_task.h"
#include "link/shard_link.h"

namespace psched {

class RpcTransport final : public PartitionTransport, private kj::TaskSet::ErrorHandler {
 public:
  // `links[i]` is shard i; the links outlive the transport. On the links' loop only.
  explicit RpcTransport(std::vector<ShardLink*> links);
  ~RpcTransport() noexcept override;

  void start(const PartitionTask& task, TaskCallbacks callbacks) override;
  void start_fused(std::vector<PartitionTask> tasks, std::vector<TaskCallbacks> callbacks) override;

 private:
  struct Carried;
  struct CarriedGroup;

  // One attempt at carrying; on a lost connection, the next once the link
  // has recovered.
  kj::Promise<void> attempt(std::shared_ptr<Carried> carried);
  kj::Promise<void> attempt_fused(std::shared_ptr<CarriedGroup> group);
  void taskFailed(kj::Exception&& exception) override;

  std::vector<ShardLink*> links_;
  kj::TaskSet tasks_;
};

}  // namespace psched
