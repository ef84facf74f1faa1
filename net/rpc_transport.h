// RpcTransport: carries scheduled partitions over the shard links. start() may be called from
// any thread (the scheduler's strand); the calls are made on the KJ thread through the mailbox.
// The push and the poll of a partition are sent back to back (the poll does not wait for the
// push's receipt), so a partition costs one round trip.
#pragma once

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
  // With `on_receipt` (sync mode) a partition's credit is freed when its push is acknowledged,
  // not when its fresh value is back (see TaskCallbacks::credit_free). KJ thread, before the
  // first start.
  void set_free_credit_on_receipt(bool on_receipt) { free_credit_on_receipt_ = on_receipt; }

 private:
  void carry(const PartitionTask& task, TaskCallbacks callbacks);  // on the KJ thread
  void taskFailed(kj::Exception&& exception) override;

  KjMailbox& mailbox_;
  std::vector<ShardLink*> links_;
  bool free_credit_on_receipt_ = false;
  kj::TaskSet tasks_;
};

}  // namespace psched
