// SPDX-License-Identifier: Apache-2.0
#include "link/data_path.h"

#include <fmt/format.h>

#include "compression/codec.h"

namespace psched {

size_t PartitionRequest::value_bytes() const {
  return encoded_bytes(value_format, dtype, range.size());
}

std::optional<Error> PartitionRequest::land(std::span<const std::byte> value) const {
  if (value.size() != value_bytes())
    return Error(
        ErrorCode::shape_mismatch,
        fmt::format("shard answered {} bytes where {} were expected", value.size(), value_bytes()));
  decode(value_format, dtype, value, {out, bytes()});
  return std::nullopt;
}

}  // namespace psched
