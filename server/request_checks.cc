// SPDX-License-Identifier: Apache-2.0
#include "server/request_checks.h"

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

void check_poll_room(const LimitsConfig& limits, uint64_t waiting) {
  if (waiting >= limits.max_waiting_polls)
    fail(ErrorCode::overloaded,
         "poll rejected: {} polls of this connection are waiting, the limit "
         "(limits.max_waiting_polls)",
         waiting);
}

}  // namespace psched
