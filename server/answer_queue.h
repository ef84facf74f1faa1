// SPDX-License-Identifier: Apache-2.0
// AnswerQueue: the order in which one worker's answers leave the shard, the one place it is
// decided. Receipts and errors go first (a receipt frees the worker's credit), then values best
// priority first (the layers nearest the input), and in the order they became ready within a
// priority. Answers wait here only while the connection has no room for them: once bytes are
// in a socket they cannot be overtaken, so a first-layer value ready late still leaves before
// the megabytes of last-layer values that were ready earlier and are still waiting.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "actors/shard/value_deltas.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"
#include "server/shard_trace.h"

namespace psched {

enum class AnswerKind : uint8_t {
  receipt,  ///< a push was validated and applied (or accumulated)
  value,    ///< a poll's or pull's fresh value
  error,    ///< the request was refused; nothing changed
};

// One answer to one of a worker's requests, named by the front end's request id.
struct Answer {
  AnswerKind kind = AnswerKind::receipt;
  uint64_t id = 0;
  Priority priority;          // a value's, from its variable
  Step applied_step;          // value: the step whose update it holds at least
  int64_t applied_at_ns = 0;  // value: the shard's wall clock when it was found ready
  // value: the range in the variable's memory, which lives as long as the shard; it is read
  // as the answer leaves, so it may hold updates applied after applied_step. The data plane
  // narrows it to `format` as it leaves (then `value` points into `narrowed`).
  std::span<const std::byte> value;
  DType dtype = DType::float32;            // value: the variable's
  WireFormat format = WireFormat::none;    // value: as the request asked; topk: a delta
  std::shared_ptr<const void> narrowed{};  // value: holds the narrowed bytes
  // value of a delta poll: what it asks for, answered as it leaves (then `format` becomes
  // topk where a delta is sent), and the version the worker holds once it applied the answer.
  struct DeltaPoll {
    VariableId variable;
    ElementRange range;
    DeltaAsk ask;
  };
  std::optional<DeltaPoll> delta{};
  uint64_t version = 0;
  std::optional<Error> error;                 // error
  std::optional<ShardTrace::Request> traced;  // a value's, when tracing

  static Answer receipt(uint64_t id);
  static Answer refusal(uint64_t id, Error error);
  // `bytes` of a variable of `priority`, holding at least `step`'s update, to leave in
  // `format`.
  static Answer fresh_value(uint64_t id, Priority priority, Step step,
                            std::span<const std::byte> bytes, DType dtype, WireFormat format,
                            int64_t applied_at_ns = 0);
};

class AnswerQueue {
 public:
  void push(Answer answer);
  // The best answer, removed. Requires !empty().
  Answer pop();
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }

 private:
  struct Entry {
    int64_t rank;  // receipts and errors before every value
    uint64_t sequence;
    Answer answer;
  };
  static bool later(const Entry& a, const Entry& b);  // heap order: a goes after b

  std::vector<Entry> heap_;
  uint64_t next_sequence_ = 0;
};

}  // namespace psched
