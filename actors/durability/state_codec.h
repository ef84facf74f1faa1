// SPDX-License-Identifier: Apache-2.0
// The binary encoding (common/byte_codec.h) of what a shard persists beyond raw bytes:
// variable and table specs and interval sets. Decoding checks what it reads and throws
// Error(corrupt_checkpoint) on values no encoder writes.
#pragma once

#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "common/byte_codec.h"
#include "common/interval_set.h"

namespace psched {

void encode(ByteWriter& out, const VariableSpec& spec);
VariableSpec decode_spec(ByteReader& in);

// A table's spec, its capacity (max_rows, admit_after) with it.
void encode_table_spec(ByteWriter& out, const TableSpec& spec);
TableSpec decode_table_spec(ByteReader& in);

void encode(ByteWriter& out, const IntervalSet& set);
IntervalSet decode_intervals(ByteReader& in);

void encode(ByteWriter& out, ElementRange range);
ElementRange decode_range(ByteReader& in);

}  // namespace psched
