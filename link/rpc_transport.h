// SPDX-License-Identifier: Apache-2.0
// RpcTransport: carries scheduled partitions over the shard links. It lives on the worker's
// loop with the scheduler and the links: start() sends at once, with no hop. A partition is
// one pushPoll call (its gradient up, its fresh value back), fused partitions one
// pushPollFused. When the receipt must come first (set_receipt_first), the push and the poll
// go as two calls sent back to back (the poll does not wait for the receipt): still one round
// trip, twice the messages.
#pragma once

#include <memory>
#include <vector>

#include "actors/worker/partition_task.h"
#include "link/shard_link.h"

namespace psched {

class RpcTransport final : public PartitionTransport, private kj::TaskSet::ErrorHandler {
 public:
  // `links[i]` is shard i; the links outlive the transport. On the links' loop only.
  explicit RpcTransport(std::vector<ShardLink*> links);
  ~RpcTransport() noexcept override;

  void start(const PartitionTask& task, TaskCallbacks callbacks) override;
  void start_fused(std::vector<PartitionTask> tasks, std::vector<TaskCallbacks> callbacks) override;

  // Whether a partition's receipt must arrive before its fresh value (sync mode, whose
  // scheduler frees credit on receipt while the value waits for every worker). Off by default.
  void set_receipt_first(bool receipt_first) { receipt_first_ = receipt_first; }

 private:
  struct Carried;
  struct CarriedGroup;

  // One attempt at carrying; on a lost connection, the next once the link
  // has recovered.
  kj::Promise<void> attempt(std::shared_ptr<Carried> carried);
  kj::Promise<void> attempt_fused(std::shared_ptr<CarriedGroup> group);
  // Sends the partition; resolves with the shard's time of the answer, its receipt reported.
  kj::Promise<int64_t> send(std::shared_ptr<Carried> carried, ShardLink& link);
  // Sends the `live` partitions of `group` (`parts`); resolves with one outcome each, the
  // receipts reported and refused pushes finished.
  kj::Promise<std::vector<PollOutcome>> send_fused(std::shared_ptr<CarriedGroup> group,
                                                   const std::vector<size_t>& live, ShardLink& link,
                                                   std::span<const FusedPartition> parts);
  void taskFailed(kj::Exception&& exception) override;

  std::vector<ShardLink*> links_;
  bool receipt_first_ = false;
  kj::TaskSet tasks_;
};

}  // namespace psched
