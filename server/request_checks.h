// SPDX-License-Identifier: Apache-2.0
// The checks the data plane (server/data_plane.h) makes of a worker's request, whichever front
// end decoded it, before the request reaches the shard. Each throws psched::Error naming what
// is wrong.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "actors/shard/shard_request.h"
#include "common/dtype.h"
#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"
#include "config/deployment.h"

namespace psched {

// [offset, offset + count) after checking it does not overflow; `what` names the request.
ElementRange checked_range(const char* what, uint64_t offset, uint64_t count);
// `worker`'s push of `data` (a view into the request) to `variable`, after checking its size
// against the message limit and that it holds whole elements of `dtype`.
Push check_push(const LimitsConfig& limits, WorkerId worker, uint32_t variable, uint64_t step,
                uint64_t offset, DType dtype, std::span<const std::byte> data,
                PushedGradient gradient);
// Throws [invalid_argument] unless fresh values may travel in `format` (none, bf16, fp16).
void check_value_format(WireFormat format);
// Throws [overloaded] naming `what` ("poll", "push of rows") when `waiting` polls of one
// connection already wait, a held push counting as one (limits.max_waiting_polls).
void check_poll_room(const char* what, const LimitsConfig& limits, uint64_t waiting);

// The ids of a `what` ("push", "pull") of rows of `table`, from their little-endian bytes,
// after checking they are whole 8-byte ids within the message limit.
std::vector<uint64_t> checked_ids(const char* what, uint32_t table, std::span<const std::byte> ids,
                                  const LimitsConfig& limits);
// Throws [invalid_argument] unless rows may travel in `format` (none, bf16, fp16: top-k and
// 1-bit are for dense gradients).
void check_row_format(const char* what, uint32_t table, WireFormat format);

}  // namespace psched
