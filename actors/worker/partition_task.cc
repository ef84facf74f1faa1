// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/partition_task.h"

#include <fmt/format.h>

#include "compression/codec.h"

namespace psched {

size_t Landing::wire_bytes() const {
  return encoded_bytes(format, dtype, elements);
}

Result<> Landing::land(std::span<const std::byte> value) const {
  if (value.size() != wire_bytes())
    return Error(
        ErrorCode::shape_mismatch,
        fmt::format("shard answered {} bytes where {} were expected", value.size(), wire_bytes()));
  decode(format, dtype, value, {out, bytes()});
  return {};
}

}  // namespace psched
