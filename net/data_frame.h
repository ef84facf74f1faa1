// SPDX-License-Identifier: Apache-2.0
// The data stream's frame headers (declared in net/psched.capnp, beside the interfaces): a
// worker's requests and the shard's answers, as psched reads and writes them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "compression/wire_format.h"
#include "net/psched.capnp.h"

namespace psched {

inline const std::string_view kDataPreface{wire::DATA_PREFACE.get().cStr(),
                                           wire::DATA_PREFACE.get().size()};
inline constexpr size_t kDataKeyBytes = wire::DATA_KEY_BYTES;
inline constexpr size_t kFrameHeaderBytes = wire::FRAME_HEADER_BYTES;
using FrameHeaderBytes = std::array<std::byte, kFrameHeaderBytes>;

struct RequestHeader {
  wire::RequestKind kind = wire::RequestKind::PUSH;
  DType dtype = DType::float32;
  uint32_t variable = 0;
  uint64_t id = 0;  // the worker's; answers name it
  uint64_t step = 0;
  uint64_t offset = 0;      // in elements; push_rows, pull_rows: how many ids start the body
  uint64_t body_bytes = 0;  // push, push_poll, push_rows, pull_rows: the bytes that follow
  uint64_t count = 0;       // poll: elements asked for
  WireFormat format = WireFormat::none;        // push, push_poll: of the body
  WireFormat value_format = WireFormat::none;  // poll, push_poll: of the value asked for
  // poll, push_poll: a delta poll's (delta_count > 0) version held and what it asks for.
  uint64_t base_version = 0;
  uint32_t delta_count = 0;
  uint16_t delta_ring = 0;
  bool delta_refresh = false;
};

struct AnswerHeader {
  wire::AnswerKind kind = wire::AnswerKind::RECEIPT;
  uint64_t id = 0;
  uint64_t applied_step = 0;
  int64_t applied_at_ns = 0;
  uint64_t body_bytes = 0;
  WireFormat format = WireFormat::none;  // value: of the body (topk: a delta)
  uint64_t version = 0;                  // value: of a delta poll's answer
};

FrameHeaderBytes encode(const RequestHeader& request);
FrameHeaderBytes encode(const AnswerHeader& answer);
// The request in `bytes`, or nullopt with `why` set when its kind, dtype or a format is none
// we know.
std::optional<RequestHeader> decode_request(const FrameHeaderBytes& bytes, std::string& why);
// The answer in `bytes`, or nullopt when its kind or its body's format is none we know.
std::optional<AnswerHeader> decode_answer(const FrameHeaderBytes& bytes);

}  // namespace psched
