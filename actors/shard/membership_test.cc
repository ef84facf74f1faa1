// SPDX-License-Identifier: Apache-2.0
// Sync membership: which workers a step waits for (Membership, StepTrack), and joins, leaves and
// restarts through the shard (VariableShard, its StepMachine).
#include "actors/shard/membership.h"

#include <chrono>
#include <optional>
#include <vector>

#include <doctest/doctest.h>

#include "actors/durability/temp_dir.h"
#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "actors/shard/variable.h"
#include "actors/shard/variable_shard.h"
#include "actors/shard/variable_test_support.h"
#include "common/error.h"

using namespace psched;
using psched::testing::code_of;
using psched::testing::sgd_spec;
using psched::testing::Tracked;
using psched::testing::value_of;

namespace {

using Clock = std::chrono::steady_clock;

// A sync variable "w" of `n` elements, all `initial`, under SGD (lr 1), waiting for `members`.
Tracked member_variable(uint64_t n, const Membership& members, float initial = 0) {
  std::vector<float> init(n, initial);
  return Tracked(sgd_spec(n), {0, n}, std::as_bytes(std::span(init)), Mode::sync, members.workers(),
                 nullptr, nullptr, &members);
}

std::vector<ElementRange> push(Tracked& v, uint32_t worker, Step step, ElementRange range,
                               std::vector<float> g) {
  return v.push(WorkerId(worker), step, range, DType::float32, std::as_bytes(std::span(g))).applied;
}

}  // namespace

TEST_CASE("a step whose member left completes with the gradients that reached each element") {
  Membership members(3, 2);
  Tracked v = member_variable(4, members);
  push(v, 0, Step(1), {0, 4}, {3, 3, 3, 3});
  push(v, 2, Step(1), {0, 2}, {9, 9});  // worker 2 pushed half of step 1, then died
  CHECK(v.settle().empty());            // still a member: the step waits for 1 and 2
  members.leave(WorkerId(2));
  CHECK(v.settle().empty());  // worker 1 has not pushed
  CHECK(push(v, 1, Step(1), {0, 4}, {6, 6, 6, 6}) == std::vector<ElementRange>{{0, 2}, {2, 4}});
  // [0, 2): the mean of three gradients, 2 included; [2, 4): of the two that reached it.
  CHECK(value_of(v) == std::vector<float>{-6, -6, -4.5, -4.5});
  CHECK(v.track.applied_step(kAllWorkers) == Step(1));
  auto records = v.track.take_short_handed();
  REQUIRE(records.size() == 1);
  CHECK(records[0].step == Step(1));
  CHECK(records[0].range == ElementRange{2, 4});
  CHECK(records[0].workers == std::vector<uint32_t>{0, 1});
  // Step 2 waits only for the members.
  push(v, 0, Step(2), {0, 4}, {1, 1, 1, 1});
  CHECK(push(v, 1, Step(2), {0, 4}, {1, 1, 1, 1}).size() == 1);
  CHECK(v.track.applied_step(kAllWorkers) == Step(2));
}

TEST_CASE("a member leaving lets the step apply what the others already pushed") {
  Membership members(3, 1);
  Tracked v = member_variable(2, members);
  push(v, 0, Step(1), {0, 2}, {2, 2});
  push(v, 1, Step(1), {0, 2}, {4, 4});
  members.leave(WorkerId(2));
  auto applied = v.settle();
  REQUIRE(applied.size() == 1);
  CHECK(applied[0].step == Step(1));
  CHECK(Tracked::complete_ranges(applied[0]) == std::vector<ElementRange>{{0, 2}});
  CHECK(value_of(v) == std::vector<float>{-3, -3});
  CHECK(v.track.applied_step(kAllWorkers) == Step(1));
}

TEST_CASE("below min_workers nothing applies until a worker joins again") {
  Membership members(3, 2);
  Tracked v = member_variable(2, members);
  members.leave(WorkerId(1));
  members.leave(WorkerId(2));
  CHECK(push(v, 0, Step(1), {0, 2}, {2, 2}).empty());  // one member, two needed
  CHECK(v.settle().empty());
  members.join(WorkerId(2), Step(2));  // joins from the step after the one under way
  auto applied = v.settle();
  REQUIRE(applied.size() == 1);
  CHECK(applied[0].step == Step(1));
  CHECK(value_of(v) == std::vector<float>{-2, -2});
  // Step 2 waits for the newcomer.
  CHECK(push(v, 0, Step(2), {0, 2}, {2, 2}).empty());
  CHECK(push(v, 2, Step(2), {0, 2}, {4, 4}).size() == 1);
  CHECK(value_of(v) == std::vector<float>{-5, -5});
}

TEST_CASE("steps that wait for nobody complete unchanged up to a newcomer's first step") {
  Membership members(2, 1);
  Tracked v = member_variable(2, members, 1);
  members.leave(WorkerId(0));
  members.leave(WorkerId(1));
  members.join(WorkerId(1), Step(4));
  auto applied = v.settle();
  REQUIRE(applied.size() == 3);
  CHECK(applied.back().step == Step(3));
  CHECK(v.track.applied_step(kAllWorkers) == Step(3));
  CHECK(value_of(v) == std::vector<float>{1, 1});
  CHECK(v.track.take_short_handed()
            .empty());  // nothing was applied short-handed: nothing was applied
}

TEST_CASE("a worker's pushes outside its membership are refused and change nothing") {
  Membership members(2, 1);
  Tracked v = member_variable(2, members);
  push(v, 0, Step(1), {0, 2}, {2, 2});
  push(v, 1, Step(1), {0, 2}, {2, 2});
  members.leave(WorkerId(1));
  CHECK(code_of([&] { push(v, 1, Step(2), {0, 2}, {1, 1}); }) == ErrorCode::not_a_member);
  CHECK(code_of([&] { push(v, 1, Step(1), {0, 2}, {1, 1}); }) == ErrorCode::stale_step);
  members.join(WorkerId(1), Step(3));
  push(v, 0, Step(2), {0, 2}, {2, 2});  // step 2 does not wait for worker 1
  CHECK(v.track.applied_step(kAllWorkers) == Step(2));
  CHECK(code_of([&] { push(v, 1, Step(2), {0, 2}, {1, 1}); }) == ErrorCode::stale_step);
  CHECK(value_of(v) == std::vector<float>{-4, -4});
  CHECK(code_of([&] { push(v, 1, Step(4), {0, 2}, {1, 1}); }) == ErrorCode::step_from_future);
}

TEST_CASE("a membership saved and loaded keeps who is a member, from when, and who pushed") {
  Membership members(3, 1);
  members.leave(WorkerId(1));
  members.join(WorkerId(2), Step(7));
  members.pushed(WorkerId(0));
  ByteWriter out;
  members.save(out);
  Membership loaded(3, 1);
  ByteReader in(out.bytes(), "membership");
  loaded.load(in);
  CHECK(loaded.members() == 2);
  CHECK(loaded.joined_at(WorkerId(0)) == Step(1));
  CHECK(loaded.has_pushed(WorkerId(0)));
  CHECK_FALSE(loaded.is_member(WorkerId(1)));
  CHECK(loaded.joined_at(WorkerId(2)) == Step(7));
  CHECK_FALSE(loaded.has_pushed(WorkerId(2)));
  Membership other(4, 1);
  ByteReader again(out.bytes(), "membership");
  CHECK(code_of([&] { other.load(again); }) == ErrorCode::corrupt_checkpoint);
}

namespace {

// A sync shard of 3 workers (min_workers 2, lease 3 s) with one variable "w" of 2 elements
// under SGD, lr 1; optionally persisting into `directory`.
struct MemberShard {
  testing::TestLoop io;
  VariableShard shard;
  VariableId id;

  explicit MemberShard(const std::filesystem::path& directory = {})
      : MemberShard(settings(directory)) {}
  explicit MemberShard(ShardSettings settings) : shard(io.actors, settings) {
    const std::filesystem::path& directory = settings.checkpoint_directory;
    if (!directory.empty()) restore();
    VariableSpec spec = sgd_spec(2);
    std::vector<float> init{0, 0};
    shard.register_variable(spec, {0, 2}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { id = r->id; });
    io.drain();
  }
  static ShardSettings settings(const std::filesystem::path& directory) {
    ShardSettings s{ShardId(0), Mode::sync, 3, 4};
    s.checkpoint_directory = directory;
    s.steps.min_workers = 2;
    s.steps.lease_seconds = 3;
    return s;
  }
  void restore() { testing::restored(io, shard); }
  void checkpoint() { testing::checkpointed(io, shard); }
  std::optional<Error> push(uint32_t worker, Step step, std::vector<float> g) {
    testing::Receipted receipt;
    shard.push({WorkerId(worker), id, step, {0, 2}, DType::float32, std::as_bytes(std::span(g))},
               receipt.reply());
    io.drain();
    REQUIRE(receipt.done());
    return receipt.refusal;
  }
  Step join(uint32_t worker, Step at_least = Step(1)) {
    std::optional<Result<Step>> from;
    shard.join(WorkerId(worker), at_least, [&](const Result<Step>& r) { from = r; });
    io.drain();
    REQUIRE(from);
    if (!*from) throw from->error();
    return from->value();
  }
  // A poll of worker `worker` for `step`: its answer lands in `out` (empty until answered).
  void poll(uint32_t worker, Step step, std::optional<std::vector<float>>& out) {
    shard.poll({WorkerId(worker), id, step, {0, 2}, PollTicket(next_ticket++)}, into(out));
    io.drain();
  }
  // A reply that puts the value into `out`; a refusal fails the test.
  static VariableShard::ValueReply into(std::optional<std::vector<float>>& out) {
    return [&out](const Result<FreshValue>& v) {
      REQUIRE(v);
      out.emplace(2);
      v->read_into(std::as_writable_bytes(std::span(*out)));
    };
  }
  uint64_t next_ticket = 1;
  std::vector<float> value() {
    testing::Answered out;
    shard.pull(id, {0, 2}, out.reply());
    io.drain();
    REQUIRE(out.value);
    return *out.value;
  }
  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = s; });
    io.drain();
    return out;
  }
};

}  // namespace

TEST_CASE("declared workers that have not pushed start at step 1, however late they join") {
  MemberShard f;
  CHECK(f.join(0) == Step(1));
  CHECK_FALSE(f.push(0, Step(1), {3, 3}));
  CHECK_FALSE(f.push(1, Step(1), {3, 3}));
  CHECK(f.join(2) == Step(1));  // the others wait for it at step 1
  CHECK_FALSE(f.push(2, Step(1), {3, 3}));
  CHECK(f.value() == std::vector<float>{-3, -3});
  CHECK(f.stats().joins == 0);  // nothing changed
}

TEST_CASE("a worker whose lease ended leaves; the step goes on and polls are answered") {
  MemberShard f;
  for (uint32_t w = 0; w < 3; ++w) f.shard.connected(WorkerId(w));
  for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(f.push(w, Step(1), {3, 3}));
  CHECK_FALSE(f.push(0, Step(2), {2, 2}));
  CHECK_FALSE(f.push(1, Step(2), {4, 4}));
  std::optional<std::vector<float>> answer;
  f.poll(0, Step(2), answer);
  auto killed = Clock::now();
  f.shard.disconnected(WorkerId(2));  // SIGKILL closes its connections
  f.io.drain();
  f.shard.enforce_deadlines(killed + std::chrono::seconds(1));
  f.io.drain();
  CHECK_FALSE(answer);
  f.shard.enforce_deadlines(killed + std::chrono::seconds(4));
  f.io.drain();
  REQUIRE(answer);
  CHECK(*answer == std::vector<float>{-6, -6});
  ShardStats stats = f.stats();
  CHECK(stats.members == 2);
  CHECK(stats.leaves == 1);
  CHECK(stats.short_handed_ranges == 1);
  // Its pushes are refused from now on; a new process with its id joins at the next step.
  CHECK(f.push(2, Step(3), {1, 1})->code() == ErrorCode::not_a_member);
  CHECK(f.join(2) == Step(3));
  CHECK(f.stats().joins == 1);
}

TEST_CASE("a restarted worker joins after the steps under way, which keep what it pushed") {
  MemberShard f;
  for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(f.push(w, Step(1), {3, 3}));
  CHECK_FALSE(f.push(2, Step(2), {9, 9}));  // its last push before it died
  CHECK_FALSE(f.push(0, Step(2), {3, 3}));
  // The new process's join takes the old one's place: step 2 no longer waits for it.
  CHECK(f.join(2) == Step(3));
  CHECK_FALSE(f.push(1, Step(2), {6, 6}));
  CHECK(f.value() == std::vector<float>{-9, -9});  // -3 - mean(9, 3, 6)
  CHECK(f.push(2, Step(2), {1, 1})->code() == ErrorCode::stale_step);
  CHECK_FALSE(f.push(0, Step(3), {1, 1}));
  CHECK_FALSE(f.push(1, Step(3), {1, 1}));
  CHECK(f.value() == std::vector<float>{-9, -9});  // step 3 waits for the newcomer
  CHECK_FALSE(f.push(2, Step(3), {4, 4}));
  CHECK(f.value() == std::vector<float>{-11, -11});
}

TEST_CASE("joins ask every shard and agree on the largest step") {
  MemberShard f;
  for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(f.push(w, Step(1), {1, 1}));
  // Another shard answered step 5: asked again with it, this one moves the join there.
  CHECK(f.join(2, Step(1)) == Step(2));
  CHECK(f.join(2, Step(5)) == Step(5));
  CHECK_FALSE(f.push(0, Step(2), {1, 1}));
  CHECK_FALSE(f.push(1, Step(2), {1, 1}));
  CHECK(f.value() == std::vector<float>{-2, -2});  // step 2 did not wait for worker 2
}

TEST_CASE("a join beyond the job's workers is refused") {
  MemberShard f;
  CHECK_THROWS_WITH_AS(f.join(3), doctest::Contains("not below the job's 3 workers"), Error);
}

TEST_CASE("membership survives a restart: who left, who joined, from which step, the record") {
  testing::TempDir dir;
  {
    MemberShard f(dir.path);
    for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(f.push(w, Step(1), {3, 3}));
    CHECK_FALSE(f.push(0, Step(2), {3, 3}));
    f.shard.connected(WorkerId(1));
    f.shard.disconnected(WorkerId(1));
    f.io.drain();
    f.shard.enforce_deadlines(Clock::now() + std::chrono::seconds(4));  // worker 1 leaves
    f.io.drain();
    CHECK_FALSE(f.push(2, Step(2), {5, 5}));
    CHECK(f.join(1) == Step(3));
    CHECK(f.value() == std::vector<float>{-7, -7});
    f.checkpoint();  // what came before is no longer replayed from the log
  }
  MemberShard g(dir.path);
  CHECK(g.value() == std::vector<float>{-7, -7});
  ShardStats stats = g.stats();
  CHECK(stats.members == 3);
  CHECK(stats.joins == 1);  // the record too: joins, leaves, and who gave step 2
  CHECK(stats.leaves == 1);
  std::vector<ShortHanded> records;
  g.shard.short_handed(10, [&](std::vector<ShortHanded> r) { records = std::move(r); });
  g.io.drain();
  REQUIRE(records.size() == 1);
  CHECK(records[0].variable == "w");
  CHECK(records[0].step == Step(2));
  CHECK(records[0].workers == std::vector<uint32_t>{0, 2});
  CHECK(g.join(1) == Step(3));  // still the member it was, nothing pushed: same step
  CHECK(g.push(1, Step(2), {1, 1})->code() == ErrorCode::stale_step);
  for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(g.push(w, Step(3), {1, 1}));
  CHECK(g.value() == std::vector<float>{-8, -8});
}

namespace {

// A bounded-mode shard of 3 workers allowed `staleness` steps apart, with a 3 s lease.
ShardSettings bounded(uint64_t staleness) {
  ShardSettings s{ShardId(0), Mode::bounded, 3, 4};
  s.steps.min_workers = 1;
  s.steps.lease_seconds = 3;
  s.steps.staleness = staleness;
  return s;
}

}  // namespace

TEST_CASE("a bounded poll is held until every member pushed the step staleness behind") {
  MemberShard f(bounded(1));
  CHECK_FALSE(f.push(0, Step(1), {1, 1}));
  std::optional<std::vector<float>> first, second;
  f.poll(0, Step(1), first);  // step 1 is within the bound of step 0: answered at once
  REQUIRE(first);
  CHECK(*first == std::vector<float>{-1, -1});
  CHECK_FALSE(f.push(0, Step(2), {1, 1}));
  f.poll(0, Step(2), second);  // needs every member's step 1
  CHECK_FALSE(second);
  CHECK_FALSE(f.push(1, Step(1), {1, 1}));
  CHECK_FALSE(second);
  CHECK_FALSE(f.push(2, Step(1), {1, 1}));
  REQUIRE(second);
  CHECK(*second == std::vector<float>{-4, -4});  // every push is applied on arrival, as async
  CHECK(f.stats().polls_held == 1);
}

TEST_CASE("staleness 0 answers each step with every member's gradient of it applied") {
  MemberShard f(bounded(0));
  float expected = 0;
  for (uint64_t s = 1; s <= 4; ++s) {
    std::vector<std::optional<std::vector<float>>> answers(3);
    for (uint32_t w = 0; w < 3; ++w) {
      float g = static_cast<float>((w * 7 + s * 3) % 5) - 2;
      expected -= g;
      CHECK_FALSE(f.push(w, Step(s), {g, g}));
      f.poll(w, Step(s), answers[w]);
      CHECK(answers[w].has_value() == (w == 2));  // the last push of the step opens them all
    }
    for (uint32_t w = 0; w < 3; ++w) {
      if (!answers[w]) continue;
      CHECK(*answers[w] == std::vector<float>{expected, expected});
    }
  }
}

TEST_CASE("a large staleness lets a worker run ahead as in async mode") {
  MemberShard f(bounded(1000));
  for (uint64_t s = 1; s <= 20; ++s) {
    CHECK_FALSE(f.push(0, Step(s), {1, 1}));
    std::optional<std::vector<float>> answer;
    f.poll(0, Step(s), answer);
    REQUIRE(answer);
  }
  CHECK(f.value() == std::vector<float>{-20, -20});
  CHECK(f.stats().polls_held == 0);
}

TEST_CASE("a straggler whose lease ended stops holding the others back, and rejoins level") {
  MemberShard f(bounded(1));
  f.shard.connected(WorkerId(2));
  for (uint32_t w = 0; w < 3; ++w) CHECK_FALSE(f.push(w, Step(1), {1, 1}));
  for (uint64_t s = 2; s <= 3; ++s)
    for (uint32_t w = 0; w < 2; ++w) CHECK_FALSE(f.push(w, Step(s), {1, 1}));
  std::optional<std::vector<float>> held;
  f.poll(0, Step(3), held);  // needs worker 2's step 2
  CHECK_FALSE(held);
  auto gone = Clock::now();
  f.shard.disconnected(WorkerId(2));
  f.io.drain();
  f.shard.enforce_deadlines(gone + std::chrono::seconds(4));
  f.io.drain();
  REQUIRE(held);
  CHECK(*held == std::vector<float>{-7, -7});
  CHECK(f.push(2, Step(2), {1, 1})->code() == ErrorCode::not_a_member);
  // A new process with its id starts on a level with the slowest member, not where it stopped.
  CHECK(f.join(2) == Step(4));
  CHECK_FALSE(f.push(2, Step(4), {1, 1}));
  CHECK(f.value() == std::vector<float>{-8, -8});
}

TEST_CASE("a bounded poll held past sync.timeout_seconds fails naming who is behind, or proceeds") {
  for (TimeoutAction action : {TimeoutAction::fail, TimeoutAction::proceed}) {
    ShardSettings settings = bounded(1);
    settings.steps.timeout_seconds = 5;
    settings.steps.on_timeout = action;
    MemberShard f(settings);
    for (uint32_t w = 0; w < 2; ++w) CHECK_FALSE(f.push(w, Step(1), {1, 1}));
    CHECK_FALSE(f.push(0, Step(2), {1, 1}));
    testing::Answered answer;
    f.shard.poll({WorkerId(0), f.id, Step(2), {0, 2}, PollTicket(1)}, answer.reply());
    f.io.drain();
    f.shard.enforce_deadlines(Clock::now() + std::chrono::seconds(1));
    f.io.drain();
    CHECK_FALSE(answer.done());
    f.shard.enforce_deadlines(Clock::now() + std::chrono::seconds(6));
    f.io.drain();
    REQUIRE(answer.answers == 1);
    if (action == TimeoutAction::fail) {
      REQUIRE(answer.refusal);
      CHECK(answer.refusal->code() == ErrorCode::sync_timeout);
      CHECK(std::string(answer.refusal->what()).find("worker(s) 2 to push step 1") !=
            std::string::npos);
      CHECK(f.stats().sync_timeouts == 1);
    } else {
      REQUIRE(answer.value);
      CHECK(*answer.value == std::vector<float>{-3, -3});
    }
  }
}
