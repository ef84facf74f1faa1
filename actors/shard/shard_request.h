// SPDX-License-Identifier: Apache-2.0
// What a worker asks of a shard on the data path, as the shard takes it (VariableShard): a push
// and a poll, of a dense variable or of a table's rows, decoded and checked by the data plane
// (server/data_plane.h) from either front end.
#pragma once

#include <cstdint>
#include <span>

#include "actors/shard/poll_registry.h"
#include "common/dtype.h"
#include "common/placement.h"
#include "common/types.h"

namespace psched {

// A worker's push of step `step` to a variable or a table, as the shard takes it (the kind
// checks it: HostedKind::check_push). `data` and `ids` are borrowed until the push's reply has
// run.
// - a dense variable: `data` holds range.size() elements of `dtype`, a partition of its gradient.
// - a table: its rows held by this shard that the worker touched in the step, `ids` (each once)
//   with one gradient row each in `data` (ids.size() rows of `dtype`). Every worker pushes every
//   step of every table to every shard, with no ids when it touched none there, so that sync
//   steps close. `range` is unused.
// `rows` says which it is: what the request names must be that kind (HostedKind::check_push).
struct Push {
  WorkerId worker{};
  VariableId variable{};
  Step step{};
  ElementRange range{};
  DType dtype = DType::float32;
  std::span<const std::byte> data{};
  PushedGradient gradient = PushedGradient::whole;
  bool rows = false;
  std::span<const uint64_t> ids{};
};

// A worker's poll: the fresh value once its `step` update is applied (sync: every member's;
// async: the worker's own; step 0: at once), of `range` of a dense variable, or of the rows
// `ids` of a table (`rows`; duplicates allowed; borrowed until the reply has run). `ticket`
// (unique per shard) lets the caller withdraw it.
struct Poll {
  WorkerId worker{};
  VariableId variable{};
  Step step{};
  ElementRange range{};
  PollTicket ticket{};
  bool rows = false;
  std::span<const uint64_t> ids{};
};

}  // namespace psched
