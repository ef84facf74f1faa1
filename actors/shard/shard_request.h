// SPDX-License-Identifier: Apache-2.0
// What a worker asks of a shard on the data path, as the shard takes it (VariableShard): a
// push and a poll of a dense variable, a push and a pull of a table's rows, decoded and checked
// by the data plane (server/data_plane.h) from either front end.
#pragma once

#include <cstdint>
#include <span>

#include "actors/shard/poll_registry.h"
#include "common/dtype.h"
#include "common/placement.h"
#include "common/types.h"

namespace psched {

// One partition of a worker's gradient for step `step`, as the shard takes it: `data` holds
// range.size() elements of `dtype`, borrowed until the push's reply has run.
struct Push {
  WorkerId worker;
  VariableId variable;
  Step step;
  ElementRange range;
  DType dtype = DType::float32;
  std::span<const std::byte> data;
  PushedGradient gradient = PushedGradient::whole;
};

// A worker's poll: the fresh value of `range` once its `step` update is applied. `ticket`
// (unique per shard) lets the caller withdraw it.
struct Poll {
  WorkerId worker;
  VariableId variable;
  Step step;
  ElementRange range;
  PollTicket ticket;
};

// A worker's step `step` of the rows of table `table` that this shard holds: `ids` (each once)
// with one gradient row each in `data` (ids.size() rows of `dtype`), both borrowed until the
// push's reply has run. Every worker pushes every step of every table to every shard, with no
// ids when it touched none there, so that sync steps close.
struct RowPush {
  WorkerId worker;
  VariableId table;
  Step step;
  DType dtype = DType::float32;
  std::span<const uint64_t> ids;
  std::span<const std::byte> data;
};

// A worker's pull of rows `ids` once `step`'s update of them is applied (sync: every member's;
// async: the worker's own; step 0: at once). `ticket` (unique per shard) lets the caller
// withdraw it; `ids` are borrowed until its reply has run.
struct RowPull {
  WorkerId worker;
  VariableId table;
  Step step;
  std::span<const uint64_t> ids;
  PollTicket ticket;
};

}  // namespace psched
