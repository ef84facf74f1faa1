// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/partition_task.h"

#include <fmt/format.h>

#include "compression/codec.h"

namespace psched {

size_t Landing::wire_bytes() const {
  return encoded_bytes(format, dtype, elements);
}

Result<> Landing::land(std::span<const std::byte> value, WireFormat answered,
                       uint64_t answered_version) const {
  if (!takes(answered))
    return Error(ErrorCode::invalid_argument,
                 fmt::format("shard answered in {} where {} was asked for", to_string(answered),
                             to_string(format)));
  if (answered == WireFormat::topk) {
    try {
      apply_delta(dtype, value, {out, bytes()});
    } catch (const Error& e) {
      return e;
    }
  } else {
    if (value.size() != wire_bytes())
      return Error(ErrorCode::shape_mismatch,
                   fmt::format("shard answered {} bytes where {} were expected", value.size(),
                               wire_bytes()));
    decode(format, dtype, value, {out, bytes()});
  }
  if (version != nullptr) *version = answered_version;
  return {};
}

}  // namespace psched
