// SPDX-License-Identifier: Apache-2.0
#include "server/request_checks.h"

#include <cstring>

#include "common/error.h"

namespace psched {

ElementRange checked_range(const char* what, uint64_t offset, uint64_t count) {
  if (offset > UINT64_MAX - count)
    fail(ErrorCode::offset_out_of_range, "{} rejected: offset {} + count {} overflows", what,
         offset, count);
  return {offset, offset + count};
}

Push check_push(const LimitsConfig& limits, WorkerId worker, uint32_t variable, uint64_t step,
                uint64_t offset, DType dtype, std::span<const std::byte> data,
                PushedGradient gradient) {
  if (data.size() > limits.max_message_bytes)
    fail(ErrorCode::message_too_large,
         "push to variable id {} rejected: {} bytes of data exceed the message limit of {} bytes "
         "(limits.max_message_bytes)",
         variable, data.size(), limits.max_message_bytes);
  if (data.size() % element_bytes(dtype) != 0)
    fail(ErrorCode::shape_mismatch,
         "push to variable id {} rejected: {} bytes of data are not whole {} elements", variable,
         data.size(), to_string(dtype));
  return {worker,     VariableId(variable),
          Step(step), checked_range("push", offset, data.size() / element_bytes(dtype)),
          dtype,      data,
          gradient};
}

void check_value_format(WireFormat format) {
  if (!carries_values(format))
    fail(ErrorCode::invalid_argument,
         "poll rejected: values cannot travel as {} (none, bf16 or fp16; {} is for pushes)",
         to_string(format), to_string(format));
}

void check_poll_room(const char* what, const LimitsConfig& limits, uint64_t waiting) {
  if (waiting >= limits.max_waiting_polls)
    fail(ErrorCode::overloaded,
         "{} rejected: {} polls of this connection are waiting, the limit "
         "(limits.max_waiting_polls; a held push counts as a poll)",
         what, waiting);
}

std::vector<uint64_t> checked_ids(const char* what, uint32_t table, std::span<const std::byte> ids,
                                  const LimitsConfig& limits) {
  if (ids.size() > limits.max_message_bytes)
    fail(ErrorCode::message_too_large,
         "{} of table id {} rejected: {} bytes of ids exceed the message limit of {} bytes "
         "(limits.max_message_bytes)",
         what, table, ids.size(), limits.max_message_bytes);
  if (ids.size() % sizeof(uint64_t) != 0)
    fail(ErrorCode::shape_mismatch, "{} of table id {} rejected: {} bytes are not whole 8-byte ids",
         what, table, ids.size());
  std::vector<uint64_t> out(ids.size() / sizeof(uint64_t));
  std::memcpy(out.data(), ids.data(), ids.size());  // little-endian, as this host (data_frame.cc)
  return out;
}

void check_row_format(const char* what, uint32_t table, WireFormat format) {
  if (!carries_values(format))
    fail(ErrorCode::invalid_argument,
         "{} of table id {} rejected: rows travel as none, bf16 or fp16, not {}", what, table,
         to_string(format));
}

}  // namespace psched
