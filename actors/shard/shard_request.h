// SPDX-License-Identifier: Apache-2.0
// What a worker asks of a shard on the data path, as the shard takes it (VariableShard): a
// push and a poll, decoded and checked by the data plane (server/data_plane.h) from either
// front end.
#pragma once

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

}  // namespace psched
