// SPDX-License-Identifier: Apache-2.0
// DataPath: how one connection to a shard carries a worker's pushes and polls, chosen once when
// the connection opens (ShardLink): as Cap'n Proto calls (link/rpc_calls.h) or as frames of a
// data stream (link/data_channel.h). Both carry the same requests to the same shard-side core
// (server/data_plane.h). KJ thread only.
#pragma once

#include <kj/async.h>

#include "actors/worker/partition_task.h"

namespace psched {

class DataPath {
 public:
  virtual ~DataPath() = default;

  // Each of these sends one partition's request now, done with `part` when it returns (what
  // it points to is another matter: PartitionRequest). It resolves when the request is
  // answered, or rejects with the shard's refusal (which changed nothing on the shard) or, the
  // connection lost, with [disconnected], after which the caller sends it again on the next
  // connection; read either with from_kj_exception, as a Cap'n Proto call's.
  //
  // Pushes the gradient; resolves at the receipt.
  virtual kj::Promise<void> push(const PartitionRequest& part) = 0;
  // The range's fresh value once its step's update is applied, landed in part.out. Dropping the
  // promise cancels the poll.
  virtual kj::Promise<Landed> poll(const PartitionRequest& part) = 0;
  // push() and poll() of the range in one request: resolves with the value, or rejects with the
  // push's refusal.
  virtual kj::Promise<Landed> push_poll(const PartitionRequest& part) = 0;
  // A table's rows (Session.pushRows, pullRows): the push resolves at its receipt; the pull
  // once the rows landed in rows.out (dropping its promise cancels it).
  virtual kj::Promise<void> push_rows(const RowsRequest& rows) = 0;
  virtual kj::Promise<Landed> pull_rows(const RowsRequest& rows) = 0;
};

}  // namespace psched
