// SPDX-License-Identifier: Apache-2.0
// The data stream's frames: a worker's pushes and polls, and the shard's answers, as a fixed
// header and raw bytes, with no per-call RPC objects. A worker opens it beside its RPC
// connection (Session.openDataStream gives the key it presents) and sends the data path over
// it; registration, pulls and the operator view stay on RPC.
//
// A data stream starts with the worker's preface: kDataPreface, then the key. The shard answers
// with a `ready` answer, or an `error` answer and closes. Then each side sends frames: a header
// of kFrameHeaderBytes and `body_bytes` after it. Integers are little-endian.
//
// Requests (worker -> shard), answered by `id`, which the worker chooses:
//   push       body: the gradient; answered by a receipt (or an error)
//   poll       body: none, `count` elements; answered by the value (or an error)
//   push_poll  body: the gradient; push, then poll of its range: answered by the value only
//   cancel     body: none; forgets the waiting poll or push_poll `id` (no answer)
// Answers (shard -> worker): receipt (no body), value (body: the range's bytes), error (body:
// "[code] message", as an RPC exception's description; common/kj_error.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/dtype.h"

namespace psched {

inline constexpr std::string_view kDataPreface = "PSCHDAT1";
inline constexpr size_t kDataKeyBytes = 16;
inline constexpr size_t kFrameHeaderBytes = 40;
using FrameHeaderBytes = std::array<std::byte, kFrameHeaderBytes>;

enum class RequestKind : uint8_t { push = 1, poll = 2, push_poll = 3, cancel = 4 };

struct DataRequest {
  RequestKind kind = RequestKind::push;
  DType dtype = DType::float32;
  uint32_t variable = 0;
  uint64_t id = 0;
  uint64_t step = 0;
  uint64_t offset = 0;  // in elements
  uint64_t size = 0;    // push, push_poll: body bytes; poll: elements; cancel: 0
  uint64_t body_bytes() const {
    return kind == RequestKind::push || kind == RequestKind::push_poll ? size : 0;
  }
};

enum class AnswerKind : uint8_t { receipt = 1, value = 2, error = 3, ready = 4 };

struct DataAnswer {
  AnswerKind kind = AnswerKind::receipt;
  uint64_t id = 0;
  uint64_t applied_step = 0;
  int64_t applied_at_ns = 0;
  uint64_t body_bytes = 0;
};

FrameHeaderBytes encode(const DataRequest& request);
FrameHeaderBytes encode(const DataAnswer& answer);
// The request in `bytes`, or nullopt with `why` set when its kind or dtype is none we know.
std::optional<DataRequest> decode_request(const FrameHeaderBytes& bytes, std::string& why);
// The answer in `bytes`, or nullopt when its kind is none we know.
std::optional<DataAnswer> decode_answer(const FrameHeaderBytes& bytes);

}  // namespace psched
