// SPDX-License-Identifier: Apache-2.0
// TableStepper over a Scheduler and a transport the test finishes tasks on: each call's ids
// grouped by shard once, the order of a table's pushes per shard, pulls after the pushes made
// before them, prefetches below the rest, rows narrowed on the way out (in every request when the
// table reaches min_bytes, in none when it does not) and landed where the caller wants them.
#include "actors/worker/table_stepper.h"

#include <cstring>
#include <deque>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "actors/worker/transport_test_support.h"
#include "common/error.h"
#include "common/error_test_support.h"
#include "compression/codec.h"

using namespace psched;
using psched::testing::HoldingTransport;

namespace {

constexpr uint32_t kShards = 3;

// Table "emb": rows of 2 float32 elements, priority 5, registered as id 10 + shard on each shard.
TableSpec emb_spec() {
  return {.name = "emb", .num_embeddings = 1000, .dim = 2, .priority = Priority(5)};
}

// What a call's Done reported.
struct Outcome {
  int calls = 0;
  std::exception_ptr error;
  TableStepper::Done done() {
    return [this](std::exception_ptr e) {
      ++calls;
      error = e;
    };
  }
};

struct StepperFixture {
  explicit StepperFixture(Compression compression = {}, uint64_t credit = 1 << 20)
      : scheduler(
            io.actors, SchedulePolicy::priority, credit, transport,
            [this](uint64_t id, std::exception_ptr error) { CHECK(stepper.task_done(id, error)); }),
        stepper(scheduler, kShards) {
    stepper.set_map(SlotMap::even(kShards));
    stepper.add(table, emb_spec(), {VariableId(10), VariableId(11), VariableId(12)}, compression);
  }

  Outcome& push(Step step, const std::vector<uint64_t>& ids, const std::vector<float>& rows) {
    Outcome& outcome = outcomes.emplace_back();
    stepper.push(table, step, ids, std::as_bytes(std::span(rows)), outcome.done());
    io.drain();
    return outcome;
  }
  Outcome& pull(Step after, const std::vector<uint64_t>& ids, std::vector<float>& out,
                bool prefetch = false) {
    Outcome& outcome = outcomes.emplace_back();
    stepper.pull(table, after, ids, std::as_writable_bytes(std::span(out)), prefetch,
                 outcome.done());
    io.drain();
    return outcome;
  }
  // The started tasks' requests (rows) and their shards, from task `from` on.
  const RowsRequest& rows(size_t task) const {
    return std::get<RowsRequest>(transport.started.at(task).request);
  }
  uint32_t shard(size_t task) const { return transport.started.at(task).shard.value; }
  void finish(size_t task, TaskOutcome outcome = Landed{}) {
    transport.finish(transport.started.at(task).id, std::move(outcome));
    io.drain();
  }
  // Answers pull task `task` with each of its rows' values `10 * id + j` for element j, landed
  // as a data path lands it, and finishes it.
  void answer(size_t task) {
    const RowsRequest& r = rows(task);
    std::vector<float> value;
    for (uint64_t id : r.ids)
      for (uint64_t j = 0; j < r.dim; ++j) value.push_back(float(10 * id + j));
    REQUIRE(r.landing().land(std::as_bytes(std::span(value))));
    finish(task);
  }
  // The ids of `ids` that shard `shard` holds, in order.
  static std::vector<uint64_t> held_by(uint32_t shard, const std::vector<uint64_t>& ids) {
    std::vector<uint64_t> out;
    for (uint64_t id : ids)
      if (row_shard(table_key("emb"), id, SlotMap::even(kShards)) == shard) out.push_back(id);
    return out;
  }

  testing::TestLoop io;
  HoldingTransport transport;
  Scheduler scheduler;
  TableStepper stepper;
  const TableHandle table{0};
  std::deque<Outcome> outcomes;  // stable addresses
};

// Ids 0..n-1, which the three shards share between them.
std::vector<uint64_t> first_ids(uint64_t n) {
  std::vector<uint64_t> ids(n);
  for (uint64_t k = 0; k < n; ++k) ids[k] = k;
  return ids;
}

}  // namespace

TEST_CASE("ids are grouped by the shard placement gives them, in the caller's order") {
  const std::vector<uint64_t> ids{7, 3, 99, 3, 41, 8, 500};
  const auto groups = TableStepper::by_shard(table_key("emb"), ids, SlotMap::even(kShards));
  REQUIRE(groups.size() == kShards);
  size_t seen = 0;
  for (uint32_t shard = 0; shard < kShards; ++shard) {
    for (size_t k = 0; k < groups[shard].size(); ++k) {
      const uint32_t at = groups[shard][k];
      CHECK(row_shard(table_key("emb"), ids[at], SlotMap::even(kShards)) == shard);
      if (k > 0) CHECK(groups[shard][k - 1] < at);
    }
    seen += groups[shard].size();
  }
  CHECK(seen == ids.size());  // a repeated id twice, where it is
}

TEST_CASE("a push goes to every shard with the rows it holds, none even, done at every receipt") {
  StepperFixture f;
  const std::vector<uint64_t> ids = first_ids(8);
  std::vector<float> rows;
  for (uint64_t id : ids) rows.insert(rows.end(), {float(id), -float(id)});
  Outcome& pushed = f.push(Step(1), ids, rows);
  REQUIRE(f.transport.started.size() == kShards);
  for (size_t task = 0; task < kShards; ++task) {
    const RowsRequest& r = f.rows(task);
    CHECK(r.push);
    CHECK(r.step == Step(1));
    CHECK(r.table == VariableId(10 + f.shard(task)));
    CHECK(std::vector<uint64_t>(r.ids.begin(), r.ids.end()) ==
          StepperFixture::held_by(f.shard(task), ids));
    std::vector<float> sent(r.gradient.size() / sizeof(float));
    std::memcpy(sent.data(), r.gradient.data(), r.gradient.size());
    std::vector<float> expected;
    for (uint64_t id : r.ids) expected.insert(expected.end(), {float(id), -float(id)});
    CHECK(sent == expected);
    CHECK(f.transport.started[task].priority == Priority(5));
  }
  f.finish(0);
  f.finish(1);
  CHECK(pushed.calls == 0);
  f.finish(2);
  CHECK(pushed.calls == 1);
  CHECK_FALSE(pushed.error);
  // A step that touched no row still goes to every shard, so that sync steps close.
  f.push(Step(2), {}, {});
  CHECK(f.transport.started.size() == 2 * kShards);
}

TEST_CASE("a shard gets a step's push once it received the one before; other shards go on") {
  StepperFixture f;
  f.push(Step(1), {}, {});
  f.finish(1);  // shard 1 received step 1; shards 0 and 2 have not
  Outcome& second = f.push(Step(2), {}, {});
  REQUIRE(f.transport.started.size() == 4);
  CHECK(f.shard(3) == 1);
  CHECK(f.rows(3).step == Step(2));
  f.finish(0);  // shard 0's step 1: its step 2 goes now, shard 2's still waits
  REQUIRE(f.transport.started.size() == 5);
  CHECK(f.shard(4) == 0);
  f.finish(2);
  REQUIRE(f.transport.started.size() == 6);
  CHECK(f.shard(5) == 2);
  for (size_t task = 3; task < 6; ++task) f.finish(task);
  CHECK(second.calls == 1);
}

TEST_CASE("a refused push fails its call and lets the shard's next push go") {
  StepperFixture f;
  Outcome& first = f.push(Step(1), {}, {});
  Outcome& second = f.push(Step(2), {}, {});
  CHECK(f.transport.started.size() == kShards);
  f.finish(0, Error(ErrorCode::stale_step, "refused"));
  CHECK(f.transport.started.size() == kShards + 1);  // shard 0's step 2
  f.finish(1);
  f.finish(2);
  REQUIRE(first.calls == 1);
  CHECK(testing::code_of([&] { std::rethrow_exception(first.error); }) == ErrorCode::stale_step);
  for (size_t task = kShards; task < 2 * kShards; ++task) f.finish(task);
  CHECK(second.calls == 1);
  CHECK_FALSE(second.error);
}

TEST_CASE("a pull waits for the pushes made before it, not for those after") {
  StepperFixture f;
  f.push(Step(1), {}, {});
  const std::vector<uint64_t> ids = first_ids(6);
  std::vector<float> out(ids.size() * 2);
  Outcome& pulled = f.pull(Step(1), ids, out);
  CHECK(f.transport.started.size() == kShards);  // the pull waits for step 1's receipts
  f.finish(0);
  f.finish(1);
  CHECK(f.transport.started.size() == kShards);
  f.finish(2);
  REQUIRE(f.transport.started.size() > kShards);
  const size_t pulls = f.transport.started.size() - kShards;
  f.push(Step(2), {}, {});  // made after the pull: the pull does not wait for it
  for (size_t task = kShards; task < kShards + pulls; ++task) {
    CHECK_FALSE(f.rows(task).push);
    CHECK(f.rows(task).step == Step(1));
    f.answer(task);
  }
  CHECK(pulled.calls == 1);
  CHECK_FALSE(pulled.error);
}

TEST_CASE("pulled rows land where the caller's ids are, straight from each shard's answer") {
  StepperFixture f;
  const std::vector<uint64_t> ids{17, 4, 256, 9, 4, 33, 870, 2, 61};  // 4 twice
  std::vector<float> out(ids.size() * 2, -1);
  Outcome& pulled = f.pull(Step(), ids, out);
  const size_t tasks = f.transport.started.size();
  CHECK(tasks <= kShards);
  for (size_t task = 0; task < tasks; ++task) f.answer(task);
  REQUIRE(pulled.calls == 1);
  for (size_t k = 0; k < ids.size(); ++k) {
    CHECK(out[2 * k] == float(10 * ids[k]));
    CHECK(out[2 * k + 1] == float(10 * ids[k] + 1));
  }
  // Rows that are consecutive in the caller's memory land there whole.
  std::vector<uint64_t> one_shard = StepperFixture::held_by(1, first_ids(40));
  std::vector<float> whole(one_shard.size() * 2);
  f.pull(Step(), one_shard, whole);
  const RowsRequest& r = f.rows(tasks);
  CHECK(r.rows_at.empty());
  CHECK(r.out == reinterpret_cast<std::byte*>(whole.data()));
}

TEST_CASE("a prefetch goes below every task that is not one") {
  StepperFixture f;
  std::vector<float> ahead(2), now(2);
  f.pull(Step(), {1}, ahead, true);
  f.pull(Step(), {1}, now);
  REQUIRE(f.transport.started.size() == 2);
  CHECK(f.transport.started[0].priority == Priority(5 + TableStepper::kPrefetchPriority));
  CHECK(f.transport.started[1].priority == Priority(5));
}

namespace {

// The push formats, and the pull formats, of the requests started from task `from` on.
std::vector<WireFormat> push_formats(const StepperFixture& f, size_t from = 0) {
  std::vector<WireFormat> out;
  for (size_t task = from; task < f.transport.started.size(); ++task)
    out.push_back(f.rows(task).format);
  return out;
}

std::vector<WireFormat> pull_formats(const StepperFixture& f, size_t from) {
  std::vector<WireFormat> out;
  for (size_t task = from; task < f.transport.started.size(); ++task)
    out.push_back(f.rows(task).value_format);
  return out;
}

// bf16 both ways from `min_bytes` on; the fixture's table holds 1000 rows of 8 bytes.
Compression bf16_from(uint64_t min_bytes, uint64_t warmup_steps = 0) {
  return {.push = WireFormat::bf16,
          .pull = WireFormat::bf16,
          .min_bytes = min_bytes,
          .warmup_steps = warmup_steps};
}

}  // namespace

TEST_CASE("a table of min_bytes travels narrowed in every request, however few its rows") {
  StepperFixture f(bf16_from(8000));
  const std::vector<uint64_t> ids = first_ids(12);
  std::vector<float> rows(ids.size() * 2, 1.5f);
  f.push(Step(1), ids, rows);
  CHECK(push_formats(f) == std::vector<WireFormat>(kShards, WireFormat::bf16));
  for (size_t task = 0; task < kShards; ++task) {
    const RowsRequest& r = f.rows(task);
    CHECK(r.gradient.size() == 2 * 2 * r.ids.size());  // two elements of two bytes a row
    std::vector<float> widened(r.ids.size() * 2);
    decode(r.format, DType::float32, r.gradient, std::as_writable_bytes(std::span(widened)));
    CHECK(widened == std::vector<float>(widened.size(), 1.5f));
    f.finish(task);
  }
  std::vector<float> one(2);
  f.pull(Step(1), {7}, one);  // one row: 8 bytes, far below min_bytes
  CHECK(pull_formats(f, kShards) == std::vector<WireFormat>{WireFormat::bf16});
}

TEST_CASE("a table under min_bytes travels whole, however many rows a request holds") {
  StepperFixture f(bf16_from(8001));
  const std::vector<uint64_t> ids = first_ids(1000);  // the whole table, 8000 bytes
  std::vector<float> rows(ids.size() * 2, 1.5f);
  f.push(Step(1), ids, rows);
  CHECK(push_formats(f) == std::vector<WireFormat>(kShards, WireFormat::none));
  for (size_t task = 0; task < kShards; ++task) f.finish(task);
  std::vector<float> out(ids.size() * 2);
  f.pull(Step(1), ids, out);
  CHECK(pull_formats(f, kShards) == std::vector<WireFormat>(kShards, WireFormat::none));
}

TEST_CASE("a table's pushes go whole below warmup_steps, as a variable's do; its pulls do not") {
  StepperFixture f(bf16_from(0, 2));
  const std::vector<uint64_t> ids = first_ids(12);
  std::vector<float> rows(ids.size() * 2, 1.5f);
  f.push(Step(1), ids, rows);
  for (size_t task = 0; task < kShards; ++task) f.finish(task);
  f.push(Step(2), ids, rows);
  CHECK(push_formats(f, 0) == std::vector<WireFormat>{WireFormat::none, WireFormat::none,
                                                      WireFormat::none, WireFormat::bf16,
                                                      WireFormat::bf16, WireFormat::bf16});
  for (size_t task = kShards; task < 2 * kShards; ++task) f.finish(task);
  std::vector<float> out(ids.size() * 2);
  f.pull(Step(1), ids, out);
  CHECK(pull_formats(f, 2 * kShards) == std::vector<WireFormat>(kShards, WireFormat::bf16));
}

TEST_CASE("wrong sizes and unknown tables are refused before anything is sent") {
  StepperFixture f;
  std::vector<float> rows(3);
  const std::vector<uint64_t> two{1, 2};
  CHECK(testing::code_of([&] {
          f.stepper.push(f.table, Step(1), two, std::as_bytes(std::span(rows)), [](auto) {});
        }) == ErrorCode::shape_mismatch);
  CHECK(testing::code_of([&] {
          f.stepper.pull(f.table, Step(), two, std::as_writable_bytes(std::span(rows)), false,
                         [](auto) {});
        }) == ErrorCode::shape_mismatch);
  CHECK(testing::code_of([&] { f.stepper.spec(TableHandle(3)); }) == ErrorCode::invalid_argument);
  CHECK(f.transport.started.empty());
  CHECK_FALSE(f.stepper.task_done(12345, nullptr));
}
