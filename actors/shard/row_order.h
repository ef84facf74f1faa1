// SPDX-License-Identifier: Apache-2.0
// The order a RowTable (actors/shard/row_table.h) updates a push's rows in: by id, the rows of an
// id given more than once in the order given, so that their gradients are summed in that order
// and the id is updated once. A plain function on the caller's thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace psched {

// The positions 0 .. ids.size() - 1 of `ids`, ordered by id, equal ids in the order given: what
// std::stable_sort of the positions by id gives. A least-significant-digit radix sort over the
// bits the largest id has, at most 11 bits a pass (a pass reads and writes each id once), so
// it is linear in the ids: a push of 4096 ids below 2^22 takes two passes.
std::vector<uint32_t> order_by_id(std::span<const uint64_t> ids);

}  // namespace psched
