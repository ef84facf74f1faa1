// SPDX-License-Identifier: Apache-2.0
// One task on its way down the worker, described once:
//
//   PartitionRequest  one partition of a dense variable's push: what goes to the shard and where
//                     its value lands. GradientPusher fills it.
//   RowsRequest       one shard's share of a table's step: its pushed rows, or a pull of rows
//                     and where each lands. TableStepper fills it.
//   PartitionTask     either request, with what the scheduler orders it by and what keeps its
//                     memory alive. The scheduler orders tasks of both kinds in one order under
//                     two credit windows, one a direction (push_bytes, pull_bytes); LinkTransport
//                     hands the request as it is to the connection's DataPath (link/data_path.h),
//                     which writes a frame header or a call's parameters from it; a path keeps only
//                     its Landing while the value is on the way.
//
// And the transport that carries tasks to their shards and reports what became of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "common/dtype.h"
#include "common/placement.h"
#include "common/result.h"
#include "common/types.h"
#include "compression/wire_format.h"

namespace psched {

// A delta poll's part of a request (compression `pull: topk`, actors/shard/value_deltas.h).
struct DeltaPoll {
  // The version of the partition the worker's copy (the request's `out`) holds, 0 for none.
  // Owner: the GradientPusher, alive while the worker is. Null: not a delta poll.
  uint64_t* version = nullptr;
  uint32_t count = 0;    // the most elements a new delta sends
  uint16_t ring = 0;     // the deltas the shard keeps
  bool refresh = false;  // ask the shard to publish its values whole, and take them

  // The version the request says the worker holds, read as it is sent.
  uint64_t base() const { return version == nullptr ? 0 : *version; }
};

// Where a fresh value lands and the form it travels in: what a path keeps of a request while its
// value is on the way.
struct Landing {
  // Room for `elements` of `dtype`. Owner: the trainer (its parameter memory, its rows).
  std::byte* out = nullptr;
  DType dtype = DType::float32;
  uint64_t elements = 0;
  WireFormat format = WireFormat::none;  // full values travel in
  uint64_t* version = nullptr;           // a delta poll's: DeltaPoll::version
  // A value of rows that land scattered (a pull of a table's rows): row k of the value, of
  // `row_elements` elements, lands at row rows_at[k] of `out`, which has room for every row
  // rows_at names. Empty: the value lands whole at `out`. Owner: the request's task.
  std::span<const uint32_t> rows_at{};
  uint64_t row_elements = 0;

  // The bytes that land (in `dtype`).
  size_t bytes() const { return elements * element_bytes(dtype); }
  // Where row k of a scattered value lands, and its bytes.
  std::byte* row_out(size_t k) const { return out + rows_at[k] * row_bytes(); }
  size_t row_bytes() const { return row_elements * element_bytes(dtype); }
  // The bytes of full values on the wire (in `format`).
  size_t wire_bytes() const;
  // Whether an answer in `answered` may land here: `format`, or a delta (topk) for a delta poll.
  bool takes(WireFormat answered) const {
    return answered == format || (answered == WireFormat::topk && version != nullptr);
  }
  // Writes a value as answered into `out`: full values in `format`, widened, or a delta's values
  // at its indices (`answered` topk); a delta poll's version becomes `version`. An error naming
  // what is wrong ([shape_mismatch]: not wire_bytes() long, a delta of another size; a
  // malformed delta, an answer in a format not asked for), and nothing written, when it cannot.
  Result<> land(std::span<const std::byte> value, WireFormat answered, uint64_t version = 0) const;
  Result<> land(std::span<const std::byte> value) const { return land(value, format); }
};

// One partition of a push: its gradient goes up, its fresh value for `step` comes back to `out`.
struct PartitionRequest {
  VariableId variable;  // the shard's id for it
  Step step;
  ElementRange range;  // elements of the whole variable
  DType dtype = DType::float32;
  // range.size() elements in `format`; sent from where it lies when the path can (the caller
  // keeps it alive and unchanged until the request's promise resolves or is dropped), else
  // copied.
  std::span<const std::byte> gradient = {};
  // Room for range.size() elements of `dtype`. The caller keeps it alive until the promise
  // resolves or is dropped, and over a data stream while the connection lives: a value already
  // arriving lands.
  std::byte* out = nullptr;
  WireFormat format = WireFormat::none;        // of `gradient` (compression/codec.h)
  WireFormat value_format = WireFormat::none;  // the fresh value travels in (full values)
  DeltaPoll delta{};                           // a delta poll's

  Landing landing() const { return {out, dtype, range.size(), value_format, delta.version}; }
};

// One shard's share of a table's step: a push of its rows, or a pull of rows from it.
struct RowsRequest {
  VariableId table;  // the shard's id for it
  Step step;         // push: the step; pull: the step whose update the rows must hold
  // The rows' ids, each once. Owner: the task (its `keeps`).
  std::span<const uint64_t> ids;
  DType dtype = DType::float32;  // the table's
  uint64_t dim = 0;              // elements a row
  // push: ids.size() rows in `format`, owned by the task.
  std::span<const std::byte> gradient = {};
  WireFormat format = WireFormat::none;
  // pull: row k lands at row rows_at[k] of `out` (the caller's memory, alive until the task is
  // finished), travelling in `value_format`.
  std::byte* out = nullptr;
  std::span<const uint32_t> rows_at = {};
  WireFormat value_format = WireFormat::none;

  bool push = false;  // else a pull

  Landing landing() const {
    return {out, dtype, ids.size() * dim, value_format, nullptr, rows_at, dim};
  }
  // Payload bytes on the wire: the push's rows, or the pull's answer.
  uint64_t wire_bytes() const { return push ? gradient.size() : landing().wire_bytes(); }
};

struct PartitionTask {
  uint64_t id = 0;        // unique within a worker (Scheduler::reserve_task_ids)
  Priority priority;      // the variable's priority; lower goes first
  uint64_t sequence = 0;  // arrival order: fifo order and the tie-break within a priority
  ShardId shard;          // where the request goes
  // What goes to the shard: a partition of a dense variable's push (its gradient in the
  // trainer's memory, alive until the task is finished; or, compressed, in `keeps`), or a
  // table's rows.
  std::variant<PartitionRequest, RowsRequest> request;
  // What the request's spans point into, alive until the task is finished: a compressed
  // gradient, a table's ids, rows and landing places.
  std::shared_ptr<const void> keeps{};

  // The dense partition's request (the task must be one).
  PartitionRequest& partition() { return std::get<PartitionRequest>(request); }
  const PartitionRequest& partition() const { return std::get<PartitionRequest>(request); }
  // Payload bytes on the wire: a dense partition's gradient, a table's pushed rows or pulled
  // answer (what the scheduler's records count).
  uint64_t bytes() const;
  // Payload bytes the task sends (a gradient, pushed rows) and receives (a fresh value, pulled
  // rows in their wire format): what it holds of the scheduler's push and pull credit windows.
  // A dense partition both pushes and pulls; a table's push only pushes, its pull only pulls.
  // A delta poll counts the delta it asks for (the shard may answer full values when it has no
  // delta from the worker's version). A request's ids and headers count in neither.
  uint64_t push_bytes() const;
  uint64_t pull_bytes() const;
  // For the scheduler's records: the formats its body and its value travel in, and the range
  // of a dense partition (a table's: its rows, [0, ids)).
  WireFormat format() const;
  WireFormat value_format() const;
  ElementRange range() const;
};

// A task whose fresh value is in place: when the shard found it ready, on the shard's wall clock
// (ns since the Unix epoch, for traces; 0 when the transport does not know).
struct Landed {
  int64_t applied_at_ns = 0;
};

// What became of a task: its value landed, or the Error that failed it.
using TaskOutcome = Result<Landed>;

// Where a transport reports what becomes of the tasks it carries: the scheduler. A transport
// lives on the scheduler's loop and calls these there, directly (no hop), in a later turn or
// synchronously from inside start(); never from another thread.
class TaskReports {
 public:
  // The shard acknowledged task `task_id`'s push (validated, and applied or accumulated). At
  // most once, before finished(); never when the push failed. The scheduler may free the task's
  // credit here (sync mode: see Scheduler::set_free_credit_on_receipt).
  virtual void received(uint64_t task_id) = 0;
  // Task `task_id` is over: its fresh value is in place, or it failed. Exactly once.
  virtual void finished(uint64_t task_id, TaskOutcome outcome) = 0;

 protected:
  ~TaskReports() = default;
};

class PartitionTransport {
 public:
  virtual ~PartitionTransport() = default;
  // Pushes the task's gradient to its shard and polls the range's fresh value for its step
  // into task.request.out, reporting to `reports` (which outlives the task's last report).
  // The task's pointers stay valid until it is finished.
  virtual void start(PartitionTask task, TaskReports& reports) = 0;
};

}  // namespace psched
