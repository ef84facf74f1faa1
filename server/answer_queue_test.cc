// SPDX-License-Identifier: Apache-2.0
// The order in which AnswerQueue lets one worker's answers leave.
#include "server/answer_queue.h"

#include <algorithm>
#include <climits>
#include <random>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"

using namespace psched;

namespace {

Answer value(uint64_t id, int64_t priority) {
  return Answer::fresh_value(id, Priority(priority), Step(1), {}, DType::float32, WireFormat::none);
}

Answer refusal(uint64_t id) {
  return Answer::refusal(id, Error(ErrorCode::stale_step, "refused"));
}

// The ids of everything in `queue`, in the order pop() gives them.
std::vector<uint64_t> popped(AnswerQueue& queue) {
  std::vector<uint64_t> ids;
  while (!queue.empty()) ids.push_back(queue.pop().id);
  return ids;
}

}  // namespace

TEST_CASE("receipts and errors leave before every value, in the order they were queued") {
  AnswerQueue queue;
  queue.push(value(1, -100));
  queue.push(Answer::receipt(2));
  queue.push(value(3, 0));
  queue.push(refusal(4));
  queue.push(Answer::receipt(5));
  std::vector<uint64_t> order = popped(queue);
  CHECK(order == std::vector<uint64_t>{2, 4, 5, 1, 3});
}

TEST_CASE("values leave by priority, lower first, and within one in the order they were ready") {
  AnswerQueue queue;
  queue.push(value(1, 3));
  queue.push(value(2, 1));
  queue.push(value(3, 3));
  queue.push(value(4, 2));
  queue.push(value(5, 1));
  CHECK(popped(queue) == std::vector<uint64_t>{2, 5, 4, 1, 3});
}

TEST_CASE("a popped answer keeps what it was queued with") {
  AnswerQueue queue;
  queue.push(value(7, 4));
  queue.push(refusal(8));
  Answer error = queue.pop();
  CHECK(error.kind == AnswerKind::error);
  CHECK(error.id == 8);
  REQUIRE(error.error);
  CHECK(error.error->code() == ErrorCode::stale_step);
  Answer fresh = queue.pop();
  CHECK(fresh.kind == AnswerKind::value);
  CHECK(fresh.priority == Priority(4));
  CHECK(fresh.applied_step == Step(1));
}

TEST_CASE("size and empty count what waits") {
  AnswerQueue queue;
  CHECK(queue.empty());
  CHECK(queue.size() == 0);
  queue.push(value(1, 0));
  queue.push(Answer::receipt(2));
  CHECK_FALSE(queue.empty());
  CHECK(queue.size() == 2);
  queue.pop();
  CHECK(queue.size() == 1);
  queue.pop();
  CHECK(queue.empty());
}

TEST_CASE("many interleaved pushes and pops leave in the order of a sorted reference") {
  // The reference: what waits as (rank, id), ids counting up as answers are queued; the best
  // is the smallest.
  using Waiting = std::pair<int64_t, uint64_t>;
  std::mt19937 random(17);
  std::uniform_int_distribution<int> kind(0, 5), priority(-3, 3), pops(0, 2);
  AnswerQueue queue;
  std::vector<Waiting> reference;
  for (uint64_t id = 0; id < 2000; ++id) {
    const int k = kind(random);  // 0: a receipt, 1: an error, else a value
    const int64_t p = priority(random);
    queue.push(k == 0 ? Answer::receipt(id) : k == 1 ? refusal(id) : value(id, p));
    reference.emplace_back(k < 2 ? INT64_MIN : p, id);
    for (int n = pops(random); n > 0 && !reference.empty(); --n) {
      auto best = std::min_element(reference.begin(), reference.end());
      REQUIRE(queue.pop().id == best->second);
      reference.erase(best);
    }
    REQUIRE(queue.size() == reference.size());
  }
  CHECK(reference.size() > 10);  // the end below still checks an order
  std::sort(reference.begin(), reference.end());
  std::vector<uint64_t> expected;
  for (const Waiting& w : reference) expected.push_back(w.second);
  CHECK(popped(queue) == expected);
}
