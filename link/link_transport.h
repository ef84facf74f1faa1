// SPDX-License-Identifier: Apache-2.0
// LinkTransport: carries scheduled partitions over the shard links. It lives on the worker's
// loop with the scheduler and the links: start() hands the task's PartitionRequest at once,
// with no hop, to the link's current DataPath (link/data_path.h). A partition is one push_poll
// (its gradient up, its fresh value back). When the receipt must come first
// (set_receipt_first), push and poll go as two requests sent back to back (the poll does not
// wait for the receipt): still one round trip, twice the messages. A task of a table's rows is
// one pushRows or pullRows. What a lost connection
// leaves unfinished is carried again once the link has reconnected. In flight it keeps the
// task (which owns a compressed gradient) and whether its receipt was reported.
#pragma once

#include <vector>

#include "actors/worker/partition_task.h"
#include "link/shard_link.h"

namespace psched {

class LinkTransport final : public PartitionTransport, private kj::TaskSet::ErrorHandler {
 public:
  // `links[i]` is shard i; the links outlive the transport. On the links' loop only.
  explicit LinkTransport(std::vector<ShardLink*> links);
  ~LinkTransport() noexcept override;

  // Reports to `reports` directly, on the loop; synchronously from inside start() only when the
  // task fails at once (its shard's session is not open).
  void start(PartitionTask task, TaskReports& reports) override;

  // Whether a partition's receipt must arrive before its fresh value (sync mode, whose
  // scheduler frees credit on receipt while the value waits for every worker). Off by default.
  void set_receipt_first(bool receipt_first) { receipt_first_ = receipt_first; }

 private:
  struct Carried;

  // One attempt at carrying the task; after a lost connection, the next once the link has
  // recovered. `carried` lives as long as the promise (attached to it in start()).
  kj::Promise<void> attempt(Carried& carried);
  // Sends the task's request on `path`; resolves with its value, the receipt reported, or
  // rejects as the path does.
  kj::Promise<Landed> send(Carried& carried, DataPath& path);
  // A table's rows: a push resolves at its receipt (reported), a pull with its rows landed.
  kj::Promise<Landed> send_rows(Carried& carried, DataPath& path);
  void taskFailed(kj::Exception&& exception) override;

  std::vector<ShardLink*> links_;
  bool receipt_first_ = false;
  kj::TaskSet tasks_;  // one attempt() chain per task in flight
};

}  // namespace psched
