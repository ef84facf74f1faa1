// SPDX-License-Identifier: Apache-2.0
// The checks a worker's request passes before it reaches the shard, shared by both of the
// shard's faces (the RPC session, server/shard_service.h, and the data stream,
// server/data_session.h). Each throws psched::Error naming what is wrong.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"
#include "config/deployment.h"

namespace psched {

struct PushArgs {
  VariableId variable;
  Step step;
  ElementRange range;
  DType dtype;
  std::span<const std::byte> data;  // a view into the request
};

// [offset, offset + count) after checking it does not overflow; `what` names the request.
ElementRange checked_range(const char* what, uint64_t offset, uint64_t count);
// A push's arguments, after checking its size against the message limit and that `data`
// holds whole elements of `dtype`.
PushArgs check_push(const LimitsConfig& limits, uint32_t variable, uint64_t step, uint64_t offset,
                    DType dtype, std::span<const std::byte> data);
// Throws [invalid_argument] unless fresh values may travel in `format` (none, bf16, fp16).
void check_value_format(WireFormat format);
// Throws [overloaded] when `waiting` polls of one connection already wait
// (limits.max_waiting_polls).
void check_poll_room(const LimitsConfig& limits, uint64_t waiting);

}  // namespace psched
