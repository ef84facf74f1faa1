// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/gradient_pusher.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

#include "actors/runtime/test_loop.h"
#include "actors/worker/transport_test_support.h"
#include "common/error.h"
#include "compression/codec.h"

using namespace psched;
using psched::testing::HoldingTransport;

namespace {

struct PartSpec {
  uint32_t shard;
  uint32_t shard_variable;
  uint64_t end;  // parts follow each other: each begins where the previous ended
};

VariablePlan make_plan(DType dtype, uint64_t elements, std::vector<PartSpec> parts,
                       std::byte* value, Priority priority = Priority(0)) {
  VariablePlan plan;
  plan.name = "layer/w";
  plan.priority = priority;
  plan.dtype = dtype;
  plan.elements = elements;
  plan.value = value;
  uint64_t begin = 0;
  for (const auto& p : parts) {
    plan.parts.push_back(
        PlacedPart{ShardId(p.shard), VariableId(p.shard_variable), ElementRange{begin, p.end}});
    begin = p.end;
  }
  return plan;
}

std::vector<ElementRange> ranges_of(const std::vector<PartitionTask>& tasks) {
  std::vector<ElementRange> ranges;
  for (const auto& t : tasks) ranges.push_back(t.partition().range);
  return ranges;
}

// What a push's completion reported.
struct PushResult {
  int calls = 0;
  std::exception_ptr error;
};

// A pusher wired to a scheduler and a holding transport, on one io_context the test polls.
struct PusherFixture {
  explicit PusherFixture(uint64_t partition_bytes, uint64_t credit = 1 << 20)
      : scheduler(io.actors, SchedulePolicy::priority, credit, transport,
                  [this](uint64_t id, std::exception_ptr error) { pusher.task_done(id, error); }),
        pusher(scheduler, partition_bytes) {}

  void drain() { io.drain(); }
  PushResult& push(VariableHandle handle, Step step, std::span<const std::byte> gradient) {
    PushResult& result = results.emplace_back();
    pusher.push(handle, step, gradient, [this, &result](std::exception_ptr error) {
      CHECK(pusher.on_loop());
      ++result.calls;
      result.error = error;
    });
    drain();
    return result;
  }
  void finish(uint64_t id, TaskOutcome outcome = Landed{}) {
    transport.finish(id, std::move(outcome));
    drain();
  }

  testing::TestLoop io;
  HoldingTransport transport;
  Scheduler scheduler;
  GradientPusher pusher;
  std::deque<PushResult> results;  // stable addresses
};

using Ids = std::vector<uint64_t>;
using Ranges = std::vector<ElementRange>;

Error failure(const char* message) {
  return Error(ErrorCode::disconnected, message);
}

}  // namespace

TEST_CASE("cut makes consecutive whole-element partitions of at most partition_bytes") {
  std::vector<std::byte> grad(40), value(40);
  VariablePlan plan = make_plan(DType::float32, 10, {{2, 17, 10}}, value.data(), Priority(6));
  auto tasks = GradientPusher::cut(plan, Step(9), grad.data(), 12, 100);
  CHECK(ranges_of(tasks) == Ranges{{0, 3}, {3, 6}, {6, 9}, {9, 10}});
  for (size_t k = 0; k < tasks.size(); ++k) {
    const PartitionTask& t = tasks[k];
    CHECK(t.id == 100 + k);
    CHECK(t.priority == Priority(6));
    CHECK(t.sequence == 0);
    CHECK(t.bytes() == t.partition().range.size() * 4);
    CHECK(t.shard == ShardId(2));
    CHECK(t.partition().variable == VariableId(17));
    CHECK(t.partition().step == Step(9));
    CHECK(t.partition().dtype == DType::float32);
    CHECK(t.partition().gradient.data() == grad.data() + t.partition().range.begin * 4);
    CHECK(t.partition().out == value.data() + t.partition().range.begin * 4);
  }
}

TEST_CASE("cut rounds a partition size down to whole float64 elements") {
  std::vector<std::byte> grad(56), value(56);
  VariablePlan plan = make_plan(DType::float64, 7, {{0, 1, 7}}, value.data());
  auto tasks = GradientPusher::cut(plan, Step(1), grad.data(), 20, 1);
  CHECK(ranges_of(tasks) == Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 7}});
  CHECK(tasks[0].bytes() == 16);
  CHECK(tasks[3].bytes() == 8);
  CHECK(tasks[3].partition().gradient.data() == grad.data() + 48);
}

TEST_CASE("a partition smaller than one element still carries one whole element") {
  std::vector<std::byte> grad(24), value(24);
  VariablePlan plan = make_plan(DType::float64, 3, {{0, 1, 3}}, value.data());
  for (uint64_t partition_bytes : {0, 1, 7}) {
    auto tasks = GradientPusher::cut(plan, Step(1), grad.data(), partition_bytes, 1);
    CHECK(ranges_of(tasks) == Ranges{{0, 1}, {1, 2}, {2, 3}});
    for (const auto& t : tasks) CHECK(t.bytes() == 8);
  }
}

TEST_CASE("partitions never cross a shard part and carry that part's shard") {
  std::vector<std::byte> grad(40), value(40);
  VariablePlan plan = make_plan(DType::float32, 10, {{0, 11, 7}, {1, 4, 10}}, value.data());
  auto tasks = GradientPusher::cut(plan, Step(1), grad.data(), 12, 1);
  CHECK(ranges_of(tasks) == Ranges{{0, 3}, {3, 6}, {6, 7}, {7, 10}});
  CHECK(tasks[2].shard == ShardId(0));
  CHECK(tasks[2].partition().variable == VariableId(11));
  CHECK(tasks[3].shard == ShardId(1));
  CHECK(tasks[3].partition().variable == VariableId(4));
}

TEST_CASE("cut covers the variable exactly for every size, split and partition size") {
  std::vector<std::byte> grad(8 * 40), value(8 * 40);
  for (DType dtype : {DType::float32, DType::float64}) {
    const uint64_t eb = element_bytes(dtype);
    for (uint64_t elements = 0; elements <= 37; ++elements) {
      for (uint32_t shards = 1; shards <= 3; ++shards) {
        std::vector<PartSpec> parts;  // near-equal contiguous parts, maybe empty ones
        for (uint32_t s = 0; s < shards; ++s)
          parts.push_back({s, 10 + s, elements * (s + 1) / shards});
        VariablePlan plan = make_plan(dtype, elements, parts, value.data());
        for (uint64_t partition_bytes = 0; partition_bytes <= 70; ++partition_bytes) {
          CAPTURE(elements);
          CAPTURE(shards);
          CAPTURE(partition_bytes);
          const uint64_t chunk = std::max<uint64_t>(1, partition_bytes / eb);
          auto tasks = GradientPusher::cut(plan, Step(3), grad.data(), partition_bytes, 50);
          uint64_t covered = 0;
          size_t k = 0;
          for (const PlacedPart& part : plan.parts) {
            // This part's tasks: full chunks, then one shorter rest.
            uint64_t expected = (part.range.size() + chunk - 1) / chunk;
            for (uint64_t i = 0; i < expected; ++i, ++k) {
              REQUIRE(k < tasks.size());
              const PartitionTask& t = tasks[k];
              CHECK(t.id == 50 + k);
              const ElementRange& range = t.partition().range;
              CHECK(range.begin == covered);
              CHECK(part.range.contains(range));
              CHECK(range.size() == std::min(chunk, part.range.end - covered));
              CHECK(t.bytes() == range.size() * eb);
              CHECK(t.shard == part.shard);
              CHECK(t.partition().gradient.data() == grad.data() + range.begin * eb);
              CHECK(t.partition().out == value.data() + range.begin * eb);
              covered = range.end;
            }
          }
          CHECK(k == tasks.size());
          CHECK(covered == elements);
        }
      }
    }
  }
}

TEST_CASE("cut and add_variable reject parts that do not cover the variable") {
  std::vector<std::byte> grad(40), value(40);
  VariablePlan gap = make_plan(DType::float32, 10, {{0, 1, 4}, {1, 1, 10}}, value.data());
  gap.parts[1].range.begin = 5;
  VariablePlan short_plan = make_plan(DType::float32, 10, {{0, 1, 9}}, value.data());
  VariablePlan long_plan = make_plan(DType::float32, 10, {{0, 1, 11}}, value.data());
  VariablePlan no_parts = make_plan(DType::float32, 10, {}, value.data());
  for (const VariablePlan* plan : {&gap, &short_plan, &long_plan, &no_parts}) {
    CHECK_THROWS_AS(GradientPusher::cut(*plan, Step(1), grad.data(), 8, 1), std::logic_error);
    PusherFixture f(8);
    CHECK_THROWS_AS(f.pusher.add_variable(VariableHandle(0), *plan), std::logic_error);
  }
}

TEST_CASE("a push of an unknown handle fails with unknown_variable") {
  PusherFixture f(8);
  std::vector<std::byte> grad(40);
  PushResult& result = f.push(VariableHandle(7), Step(1), grad);
  CHECK(result.calls == 1);
  REQUIRE(result.error);
  try {
    std::rethrow_exception(result.error);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unknown_variable);
    CHECK(std::string(e.what()) == "push rejected: no variable with handle 7 is registered");
  }
  CHECK(f.transport.started.empty());
}

TEST_CASE("a push completes only after all its partitions are done") {
  PusherFixture f(12);
  std::vector<std::byte> grad(40), value(40);
  f.pusher.add_variable(VariableHandle(0),
                        make_plan(DType::float32, 10, {{0, 3, 10}}, value.data()));
  PushResult& result = f.push(VariableHandle(0), Step(4), grad);
  REQUIRE(f.transport.started_ids() == Ids{1, 2, 3, 4});
  for (const auto& t : f.transport.started) {
    CHECK(t.partition().step == Step(4));
    CHECK(t.partition().gradient.data() == grad.data() + t.partition().range.begin * 4);
    CHECK(t.partition().out == value.data() + t.partition().range.begin * 4);
  }
  for (uint64_t id : {3, 1, 4}) {
    f.finish(id);
    CHECK(result.calls == 0);
  }
  f.finish(2);
  CHECK(result.calls == 1);
  CHECK_FALSE(result.error);

  SUBCASE("and the next push gets fresh task ids") {
    f.push(VariableHandle(0), Step(5), grad);
    CHECK(f.transport.started_ids() == Ids{1, 2, 3, 4, 5, 6, 7, 8});
  }
}

TEST_CASE("a push reports the first error among its partitions") {
  PusherFixture f(12);
  std::vector<std::byte> grad(40), value(40);
  f.pusher.add_variable(VariableHandle(0),
                        make_plan(DType::float32, 10, {{0, 3, 10}}, value.data()));
  PushResult& result = f.push(VariableHandle(0), Step(1), grad);
  f.finish(3);
  f.finish(1, failure("first"));
  f.finish(4, failure("second"));
  CHECK(result.calls == 0);
  f.finish(2);
  CHECK(result.calls == 1);
  REQUIRE(result.error);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(result.error), "first", Error);
}

TEST_CASE("a push of a variable with no elements completes at once") {
  PusherFixture f(8);
  f.pusher.add_variable(VariableHandle(2), make_plan(DType::float32, 0, {}, nullptr));
  PushResult& result = f.push(VariableHandle(2), Step(1), {});
  CHECK(result.calls == 1);
  CHECK_FALSE(result.error);
  CHECK(f.transport.started.empty());
}

TEST_CASE("set_partition_bytes changes how later pushes are cut") {
  PusherFixture f(40);
  std::vector<std::byte> grad(40), value(40);
  f.pusher.add_variable(VariableHandle(0),
                        make_plan(DType::float32, 10, {{0, 3, 10}}, value.data()));
  f.push(VariableHandle(0), Step(1), grad);
  CHECK(f.transport.started.size() == 1);
  f.pusher.set_partition_bytes(20);
  f.push(VariableHandle(0), Step(2), grad);
  CHECK(f.transport.started.size() == 3);
  CHECK(f.transport.started[2].partition().range == ElementRange{5, 10});
}

TEST_CASE("partitions of a later, more urgent variable overtake a queued big one") {
  // Backward pushes layer 5's gradient, then layer 1's; one partition fits the credit.
  PusherFixture f(16, 16);
  std::vector<std::byte> big(64), big_value(64), small(16), small_value(16);
  f.pusher.add_variable(VariableHandle(0),
                        make_plan(DType::float32, 16, {{0, 1, 16}}, big_value.data(), Priority(5)));
  f.pusher.add_variable(VariableHandle(1),
                        make_plan(DType::float32, 4, {{1, 1, 4}}, small_value.data(), Priority(1)));
  PushResult& late = f.push(VariableHandle(0), Step(1), big);
  PushResult& urgent = f.push(VariableHandle(1), Step(1), small);
  CHECK(f.transport.started_ids() == Ids{1});
  f.finish(1);
  CHECK(f.transport.started_ids() == Ids{1, 5});
  f.finish(5);
  CHECK(urgent.calls == 1);
  CHECK(late.calls == 0);
  for (uint64_t id : {2, 3, 4}) f.finish(id);
  CHECK(f.transport.started_ids() == Ids{1, 5, 2, 3, 4});
  CHECK(late.calls == 1);
}

TEST_CASE("a push completes when the transport finishes partitions inside start") {
  PusherFixture f(8, 8);
  f.transport.finish_inside_start = true;
  std::vector<std::byte> grad(80), value(80);
  f.pusher.add_variable(VariableHandle(0),
                        make_plan(DType::float64, 10, {{0, 3, 6}, {1, 2, 10}}, value.data()));
  PushResult& result = f.push(VariableHandle(0), Step(1), grad);
  CHECK(f.transport.started.size() == 10);
  CHECK(result.calls == 1);
  CHECK_FALSE(result.error);
}

TEST_CASE("a replaced plan starts with nothing held back by error feedback") {
  // topk of one element: step 1 sends the 4 and holds back 1, 2, 3 for later steps.
  std::vector<float> value(4), first{1, 2, 3, 4}, zeros(4);
  VariablePlan plan =
      make_plan(DType::float32, 4, {{0, 0, 4}}, reinterpret_cast<std::byte*>(value.data()));
  plan.compression = {.push = WireFormat::topk, .topk = {.count = 1}, .min_bytes = 0};
  PusherFixture f(1 << 10);
  f.pusher.add_variable(VariableHandle(0), plan);
  f.drain();
  // What the last started partition carries, decoded.
  auto sent = [&] {
    std::vector<float> out(4);
    const PartitionTask& task = f.transport.started.back();
    REQUIRE(task.keeps);
    const auto& encoded = *std::static_pointer_cast<const std::vector<std::byte>>(task.keeps);
    CHECK(task.partition().gradient.data() == encoded.data());  // the encoded body goes
    CHECK(task.bytes() == encoded.size());
    CHECK(task.partition().format == WireFormat::topk);
    decode(WireFormat::topk, DType::float32, encoded, std::as_writable_bytes(std::span(out)));
    f.finish(f.transport.started.back().id);
    return out;
  };
  f.push(VariableHandle(0), Step(1), std::as_bytes(std::span(first)));
  CHECK(sent() == std::vector<float>{0, 0, 0, 4});
  SUBCASE("kept, the held-back 3 goes next") {
    f.push(VariableHandle(0), Step(2), std::as_bytes(std::span(zeros)));
    CHECK(sent() == std::vector<float>{0, 0, 3, 0});
  }
  SUBCASE("replaced, nothing is owed") {
    f.pusher.add_variable(VariableHandle(0), plan);
    f.push(VariableHandle(0), Step(2), std::as_bytes(std::span(zeros)));
    CHECK(sent() == std::vector<float>{0, 0, 0, 0});
  }
}
