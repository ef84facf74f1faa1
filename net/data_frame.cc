// SPDX-License-Identifier: Apache-2.0
#include "net/data_frame.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>

namespace psched {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the data stream's integers are little-endian, as this host's");

template <typename T>
void put(FrameHeaderBytes& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T get(const FrameHeaderBytes& in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

}  // namespace

FrameHeaderBytes encode(const RequestHeader& request) {
  FrameHeaderBytes out{};
  put(out, 0, static_cast<uint8_t>(request.kind));
  put(out, 1, static_cast<uint8_t>(request.dtype));
  put(out, 2, static_cast<uint8_t>(request.format));
  put(out, 3, static_cast<uint8_t>(request.value_format));
  put(out, 4, request.variable);
  put(out, 8, request.id);
  put(out, 16, request.step);
  put(out, 24, request.offset);
  put(out, 32, request.kind == wire::RequestKind::POLL ? request.count : request.body_bytes);
  put(out, 40, request.base_version);
  put(out, 48, request.delta_count);
  put(out, 52, request.delta_ring);
  put(out, 54, static_cast<uint8_t>(request.delta_refresh ? 1 : 0));
  return out;
}

FrameHeaderBytes encode(const AnswerHeader& answer) {
  FrameHeaderBytes out{};
  put(out, 0, static_cast<uint8_t>(answer.kind));
  put(out, 1, static_cast<uint8_t>(answer.format));
  put(out, 8, answer.id);
  put(out, 16, answer.applied_step);
  put(out, 24, answer.applied_at_ns);
  put(out, 32, answer.body_bytes);
  put(out, 40, answer.version);
  return out;
}

std::optional<RequestHeader> decode_request(const FrameHeaderBytes& bytes, std::string& why) {
  auto kind = get<uint8_t>(bytes, 0);
  auto dtype = get<uint8_t>(bytes, 1);
  if (kind < static_cast<uint8_t>(wire::RequestKind::PUSH) ||
      kind > static_cast<uint8_t>(wire::RequestKind::PULL_ROWS)) {
    why = fmt::format("unknown request kind {}", kind);
    return std::nullopt;
  }
  if (dtype > static_cast<uint8_t>(DType::float64)) {
    why = fmt::format("unknown dtype {}", dtype);
    return std::nullopt;
  }
  for (size_t at : {2, 3}) {
    if (get<uint8_t>(bytes, at) > static_cast<uint8_t>(WireFormat::onebit)) {
      why = fmt::format("unknown wire format {}", get<uint8_t>(bytes, at));
      return std::nullopt;
    }
  }
  RequestHeader out{.kind = static_cast<wire::RequestKind>(kind),
                    .dtype = static_cast<DType>(dtype),
                    .variable = get<uint32_t>(bytes, 4),
                    .id = get<uint64_t>(bytes, 8),
                    .step = get<uint64_t>(bytes, 16),
                    .offset = get<uint64_t>(bytes, 24),
                    .format = static_cast<WireFormat>(get<uint8_t>(bytes, 2)),
                    .value_format = static_cast<WireFormat>(get<uint8_t>(bytes, 3)),
                    .base_version = get<uint64_t>(bytes, 40),
                    .delta_count = get<uint32_t>(bytes, 48),
                    .delta_ring = get<uint16_t>(bytes, 52),
                    .delta_refresh = get<uint8_t>(bytes, 54) != 0};
  uint64_t size = get<uint64_t>(bytes, 32);
  if (out.kind == wire::RequestKind::POLL)
    out.count = size;
  else if (out.kind != wire::RequestKind::CANCEL)
    out.body_bytes = size;
  return out;
}

std::optional<AnswerHeader> decode_answer(const FrameHeaderBytes& bytes) {
  auto kind = get<uint8_t>(bytes, 0);
  if (kind < static_cast<uint8_t>(wire::AnswerKind::RECEIPT) ||
      kind > static_cast<uint8_t>(wire::AnswerKind::READY) ||
      get<uint8_t>(bytes, 1) > static_cast<uint8_t>(WireFormat::onebit))
    return std::nullopt;
  return AnswerHeader{static_cast<wire::AnswerKind>(kind),
                      get<uint64_t>(bytes, 8),
                      get<uint64_t>(bytes, 16),
                      get<int64_t>(bytes, 24),
                      get<uint64_t>(bytes, 32),
                      static_cast<WireFormat>(get<uint8_t>(bytes, 1)),
                      get<uint64_t>(bytes, 40)};
}

}  // namespace psched
