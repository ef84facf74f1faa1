// SPDX-License-Identifier: Apache-2.0
// A table row's initial value (TableSpec::init): a function of the table's seed and the row's
// id alone, the same on every shard and in every process. The shard computes a row from it while
// the row was never updated (actors/shard/row_table.h), and the Python binding computes the
// rows of a table exported without them (psched.torch.to_local, python/psched/export.py), so
// that a plain torch table holds, bit for bit, what the shards would have answered.
//
// Element j of row `id`: with key = mix64(seed ^ mix64(id)) (common/slot_map.h's mixer) and
// u(x) the top 53 bits of x as a double on [0, 1),
//   zeros    0
//   uniform  a + (b - a) * u(mix64(key + j))
//   normal   a + b * sqrt(-2 log(1 - u(mix64(key + 2j)))) * cos(2 pi u(mix64(key + 2j + 1)))
// computed in double (glibc's log and cos) and rounded once to the table's dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "actors/shard/table_spec.h"

namespace psched {

// Row `id`'s initial value for a table of `spec` (its init, seed, dim and dtype) into `out`,
// which holds spec.row_bytes(). Requires out.size() == spec.row_bytes().
void initial_row(const TableSpec& spec, uint64_t id, std::span<std::byte> out);

}  // namespace psched
