// SPDX-License-Identifier: Apache-2.0
#include "server/answer_queue.h"

#include <algorithm>
#include <climits>

#include "common/check.h"

namespace psched {

Answer Answer::receipt(uint64_t id) {
  Answer a;
  a.id = id;
  return a;
}

Answer Answer::refusal(uint64_t id, Error error) {
  Answer a;
  a.kind = AnswerKind::error;
  a.id = id;
  a.error = std::move(error);
  return a;
}

Answer Answer::fresh_value(uint64_t id, Priority priority, Step step,
                           std::span<const std::byte> bytes, DType dtype, WireFormat format,
                           int64_t applied_at_ns) {
  Answer a;
  a.kind = AnswerKind::value;
  a.id = id;
  a.priority = priority;
  a.applied_step = step;
  a.applied_at_ns = applied_at_ns;
  a.value = bytes;
  a.dtype = dtype;
  a.format = format;
  return a;
}

bool AnswerQueue::later(const Entry& a, const Entry& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.sequence > b.sequence;
}

void AnswerQueue::push(Answer answer) {
  int64_t rank = answer.kind == AnswerKind::value ? answer.priority.value : INT64_MIN;
  heap_.push_back({rank, next_sequence_++, std::move(answer)});
  std::push_heap(heap_.begin(), heap_.end(), later);
}

Answer AnswerQueue::pop() {
  PSCHED_REQUIRE(!heap_.empty());
  std::pop_heap(heap_.begin(), heap_.end(), later);
  Answer best = std::move(heap_.back().answer);
  heap_.pop_back();
  return best;
}

}  // namespace psched
