// SPDX-License-Identifier: Apache-2.0
// DataPath: how one connection to a shard carries a worker's pushes and polls, chosen once when
// the connection opens (ShardLink): as Cap'n Proto calls (link/rpc_calls.h) or as frames of a
// data stream (link/data_channel.h). Both carry the same requests to the same shard-side core
// (server/data_plane.h). KJ thread only.
#pragma once

#include <cstdint>
#include <span>

#include <kj/async.h>

#include "actors/worker/partition_task.h"

namespace psched {

// One step's push of a table's rows to one shard, or a pull of rows from it.
struct RowsRequest {
  VariableId table;  // the shard's id for it
  Step step;         // push: the step; pull: the step whose update the rows must hold
  // The rows' ids, each once; the caller keeps them alive until the promise resolves.
  std::span<const uint64_t> ids;
  DType dtype = DType::float32;  // the table's
  // push: ids.size() rows in `format`, kept alive by the caller as `ids`.
  std::span<const std::byte> gradient;
  WireFormat format = WireFormat::none;
  // pull: room for ids.size() rows of `dtype` (`elements` in all), where they land.
  std::byte* out = nullptr;
  uint64_t elements = 0;
  WireFormat value_format = WireFormat::none;

  Landing landing() const { return {out, dtype, elements, value_format}; }
};

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
