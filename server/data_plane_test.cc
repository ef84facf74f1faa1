// SPDX-License-Identifier: Apache-2.0
// DataPlane with a real VariableShard on the test's own loop: what each request is answered
// with, the order the answers leave in, and when the front end may read more.
#include "server/data_plane.h"

#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <kj/debug.h>

#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "common/error.h"
#include "compression/codec.h"
#include "net/wire_convert.h"

using namespace psched;
using psched::testing::Answered;

namespace {

// Keeps every answer it takes, with its value's bytes as they left; the test says whether it
// has room.
struct RecordingWriter final : AnswerWriter {
  bool room = true;
  std::vector<Answer> taken;
  std::vector<std::vector<std::byte>> bytes;  // taken[i]'s value, copied as it was taken
  int sends = 0;

  bool has_room() override { return room; }
  void take(Answer& answer) override {
    bytes.emplace_back(answer.value.begin(), answer.value.end());
    taken.push_back(answer);
  }
  void send() override { ++sends; }
  kj::Promise<void> written() override { return kj::READY_NOW; }

  std::vector<uint64_t> ids() const {
    std::vector<uint64_t> out;
    for (const Answer& a : taken) out.push_back(a.id);
    return out;
  }
  std::vector<float> floats(size_t i) const {
    std::vector<float> out(bytes.at(i).size() / sizeof(float));
    std::memcpy(out.data(), bytes[i].data(), bytes[i].size());
    return out;
  }
};

ShardSettings one_async_worker() {
  ShardSettings settings;
  settings.workers = 1;
  settings.max_variables = 8;
  return settings;
}

DeploymentConfig small_limits() {
  DeploymentConfig config;
  config.limits.max_message_bytes = 64;  // 16 floats
  config.limits.max_waiting_polls = 3;
  return config;
}

// One worker's plane (worker 0) on a one-worker async shard; every variable has lr 1 (sgd).
struct PlaneFixture {
  testing::TestLoop io;
  VariableShard shard{io.actors, one_async_worker()};
  DeploymentConfig config = small_limits();
  ShardEndpoint endpoint{shard, config, ShardId(0)};
  RecordingWriter writer;
  std::shared_ptr<DataPlane> plane = std::make_shared<DataPlane>(endpoint, WorkerId(0), writer);
  std::deque<std::vector<float>> gradients;  // the requests' bytes, kept until the test ends

  VariableId add(const std::string& name, std::vector<float> init, int64_t priority = 0) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {init.size()};
    spec.priority = Priority(priority);
    spec.optimizer.lr = 1.0;
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { registered = r; });
    io.drain();
    REQUIRE((registered && *registered));
    return (*registered)->id;
  }
  // A push (or push_poll) of `g` to the start of `variable` at `step`; not yet served.
  Request push(uint64_t id, VariableId variable, uint64_t step, std::vector<float> g,
               RequestKind kind = RequestKind::push) {
    const std::vector<float>& kept = gradients.emplace_back(std::move(g));
    return {.kind = kind,
            .id = id,
            .variable = variable.value,
            .step = step,
            .gradient = std::as_bytes(std::span(kept))};
  }
  // A poll of the first `count` elements of `variable` for `step`; not yet served.
  static Request poll(uint64_t id, VariableId variable, uint64_t step, uint64_t count,
                      WireFormat value_format = WireFormat::none) {
    return {.kind = RequestKind::poll,
            .id = id,
            .variable = variable.value,
            .step = step,
            .count = count,
            .value_format = value_format};
  }
  // What the shard holds of the first `count` elements of `variable` now.
  std::vector<float> value(VariableId variable, uint64_t count) {
    Answered pulled;
    shard.pull(variable, {0, count}, pulled.reply());
    io.drain();
    REQUIRE(pulled.value);
    return *pulled.value;
  }
  // The polls the shard has waiting (its stats), all connections'.
  uint64_t polls_waiting() {
    uint64_t waiting = ~0ull;
    shard.stats([&](ShardStats s) { waiting = s.polls_waiting; });
    io.drain();
    return waiting;
  }
};

// The error `answer` carries; stops the test when it is not an error. (Call it outside an
// assertion: it asserts itself.)
const Error& error_of(const Answer& answer) {
  REQUIRE(answer.kind == AnswerKind::error);
  REQUIRE(answer.error);
  return *answer.error;
}

}  // namespace

TEST_CASE("a push is answered by a receipt, sent at the end of the loop's turn") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.push(1, w, 1, {1, 1}));
  CHECK(f.writer.taken.empty());  // queued for the end of the turn
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 1);
  CHECK(f.writer.taken[0].kind == AnswerKind::receipt);
  CHECK(f.writer.taken[0].id == 1);
  CHECK(f.writer.sends == 1);
  CHECK(f.value(w, 2) == std::vector<float>{0, 1});
}

TEST_CASE("a poll is answered with the value once its step's push lands") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.poll(1, w, 1, 2));
  f.io.drain();
  CHECK(f.writer.taken.empty());
  CHECK(f.plane->waiting_polls() == 1);
  f.plane->serve(f.push(2, w, 1, {1, 1}));
  f.io.drain();
  REQUIRE(f.writer.ids() == std::vector<uint64_t>{2, 1});  // the receipt first
  const Answer& value = f.writer.taken[1];
  CHECK(value.kind == AnswerKind::value);
  CHECK(value.applied_step == Step(1));
  CHECK(f.writer.floats(1) == std::vector<float>{0, 1});
  CHECK(f.plane->waiting_polls() == 0);
}

TEST_CASE("a push_poll is answered by the value only") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.push(1, w, 1, {1, 1}, RequestKind::push_poll));
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 1);
  CHECK(f.writer.taken[0].kind == AnswerKind::value);
  CHECK(f.writer.taken[0].id == 1);
  CHECK(f.writer.taken[0].applied_step == Step(1));
  CHECK(f.writer.floats(0) == std::vector<float>{0, 1});
  CHECK(f.plane->waiting_polls() == 0);
}

TEST_CASE("a refused push is answered with an error naming what was wrong, and changes nothing") {
  PlaneFixture f;
  const std::vector<float> initial(32, 1.0f);
  VariableId w = f.add("w", initial);
  Request request = f.push(1, w, 1, {1, 1});
  ErrorCode code{};
  std::string says;
  SUBCASE("a dtype the front end could not decode") {
    try {
      from_wire(static_cast<wire::DType>(7));
    } catch (const Error& e) {
      request.refused = e;  // as the Cap'n Proto front end does
    }
    code = ErrorCode::dtype_mismatch;
    says = "unknown dtype number 7 on the wire";
  }
  SUBCASE("a step from the future") {
    request.step = 3;
    code = ErrorCode::step_from_future;
    says = "step 3 from the future (next step is 1)";
  }
  SUBCASE("a gradient over the message limit") {
    request = f.push(1, w, 1, std::vector<float>(17, 1.0f));  // 68 bytes
    code = ErrorCode::message_too_large;
    says = "68 bytes of data exceed the message limit of 64 bytes (limits.max_message_bytes)";
  }
  f.plane->serve(request);
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 1);
  CHECK(f.writer.taken[0].id == 1);
  const Error& error = error_of(f.writer.taken[0]);
  CHECK(error.code() == code);
  CHECK_MESSAGE(std::string(error.what()).find(says) != std::string::npos, error.what());
  CHECK(f.value(w, 32) == initial);
}

TEST_CASE("a push_poll whose push is refused answers once, with the error, and leaves no poll") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.push(1, w, 3, {1, 1}, RequestKind::push_poll));
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 1);
  const Error& error = error_of(f.writer.taken[0]);
  CHECK(error.code() == ErrorCode::step_from_future);
  CHECK(f.plane->waiting_polls() == 0);
  CHECK(f.polls_waiting() == 0);
  // Steps 1, 2, 3 land: the refused push_poll is not answered again.
  for (uint64_t step = 1; step <= 3; ++step) f.plane->serve(f.push(1 + step, w, step, {1, 1}));
  f.io.drain();
  CHECK(f.writer.ids() == std::vector<uint64_t>{1, 2, 3, 4});
  CHECK(f.value(w, 2) == std::vector<float>{-2, -1});
}

TEST_CASE("answers held back for want of room leave best first once the writer is writable") {
  PlaneFixture f;
  VariableId late = f.add("late", {1, 2}, 5);
  VariableId early = f.add("early", {1, 2}, 1);
  f.writer.room = false;
  f.plane->serve(f.poll(1, late, 1, 2));
  f.plane->serve(f.poll(2, early, 1, 2));
  f.io.drain();
  f.plane->serve(f.push(3, late, 1, {1, 1}));  // the late variable's value is ready first
  f.io.drain();
  f.plane->serve(f.push(4, early, 1, {1, 1}));
  f.plane->serve(f.poll(5, early, 1, 2, WireFormat::topk));  // refused: values cannot be topk
  f.io.drain();
  CHECK(f.writer.taken.empty());
  f.writer.room = true;
  f.plane->writable();
  // Receipts and errors in the order they were ready, then values by priority.
  CHECK(f.writer.ids() == std::vector<uint64_t>{3, 4, 5, 2, 1});
  CHECK(f.writer.sends == 1);
}

TEST_CASE("the front end may not read more while as many answers wait as polls may") {
  PlaneFixture f;  // limits.max_waiting_polls: 3
  VariableId w = f.add("w", {1, 2});
  f.writer.room = false;
  f.plane->serve(f.push(1, w, 1, {1, 1}));
  f.plane->serve(f.push(2, w, 2, {1, 1}));
  f.io.drain();
  CHECK(f.plane->has_room());  // 2 answers wait
  CHECK(f.plane->wait_for_room() == nullptr);
  f.plane->serve(f.push(3, w, 3, {1, 1}));
  f.io.drain();
  CHECK_FALSE(f.plane->has_room());  // 3 wait
  kj::Maybe<kj::Promise<void>> waiting = f.plane->wait_for_room();
  REQUIRE(waiting != nullptr);
  kj::Promise<void> room = kj::mv(KJ_ASSERT_NONNULL(waiting));
  CHECK_FALSE(room.poll(f.io.scope));
  f.writer.room = true;
  f.plane->writable();
  CHECK(room.poll(f.io.scope));
  CHECK(f.plane->has_room());
  CHECK(f.writer.ids() == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("a poll whose id is already waiting is refused, and the first still answers") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.poll(1, w, 1, 2));
  f.plane->serve(f.poll(1, w, 1, 2));
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 1);
  const Error& error = error_of(f.writer.taken[0]);
  CHECK(error.code() == ErrorCode::invalid_argument);
  CHECK(std::string(error.what()) == "request id 1 is already waiting on this connection");
  CHECK(f.plane->waiting_polls() == 1);
  f.plane->serve(f.push(2, w, 1, {1, 1}));
  f.io.drain();
  CHECK(f.writer.ids() == std::vector<uint64_t>{1, 2, 1});
  CHECK(f.writer.taken[2].kind == AnswerKind::value);
}

TEST_CASE("a cancelled poll is answered by nothing, even once its update is applied") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.poll(1, w, 1, 2));
  f.io.drain();
  REQUIRE(f.polls_waiting() == 1);
  f.plane->cancel(1);
  CHECK(f.plane->waiting_polls() == 0);
  CHECK(f.polls_waiting() == 0);
  f.plane->serve(f.push(2, w, 1, {1, 1}));
  f.io.drain();
  CHECK(f.writer.ids() == std::vector<uint64_t>{2});
  CHECK(f.value(w, 2) == std::vector<float>{0, 1});
}

TEST_CASE("dropping the plane withdraws its waiting polls from the shard") {
  PlaneFixture f;
  VariableId w = f.add("w", {1, 2});
  f.plane->serve(f.poll(1, w, 1, 2));
  f.plane->serve(f.poll(2, w, 1, 1));
  f.io.drain();
  REQUIRE(f.polls_waiting() == 2);
  f.plane.reset();
  CHECK(f.polls_waiting() == 0);
  CHECK(f.writer.taken.empty());
}

TEST_CASE("a value asked for as bf16 leaves narrowed, in half the bytes") {
  PlaneFixture f;
  VariableId w = f.add("w", {3, -2});
  f.plane->serve(f.poll(1, w, 1, 2, WireFormat::bf16));
  f.plane->serve(f.push(2, w, 1, {1, 1}));  // the value becomes {2, -3}
  f.io.drain();
  REQUIRE(f.writer.ids() == std::vector<uint64_t>{2, 1});
  const Answer& answer = f.writer.taken[1];
  CHECK(answer.format == WireFormat::bf16);
  CHECK(answer.value.size() == 4);
  // bf16 2.0 is 0x4000, -3.0 is 0xC040; little-endian on the wire.
  CHECK(f.writer.bytes[1] ==
        std::vector<std::byte>{std::byte{0x00}, std::byte{0x40}, std::byte{0x40}, std::byte{0xC0}});
}

TEST_CASE("a delta poll is answered whole first, then with the elements that changed most") {
  PlaneFixture f;
  VariableId w = f.add("w", {0, 0, 0, 0});
  auto delta_poll = [&](uint64_t id, uint64_t step, uint64_t base) {
    Request poll = f.poll(id, w, step, 4, WireFormat::bf16);
    poll.delta = {.base = base, .count = 1, .ring = 2};
    return poll;
  };
  f.plane->serve(delta_poll(1, 1, 0));
  f.plane->serve(f.push(2, w, 1, {-1, -1, -1, -1}));  // the value becomes {1, 1, 1, 1}
  f.io.drain();
  REQUIRE(f.writer.ids() == std::vector<uint64_t>{2, 1});
  const Answer& whole = f.writer.taken[1];
  CHECK(whole.format == WireFormat::bf16);  // no version: the range whole, as asked
  CHECK(whole.value.size() == 8);
  const uint64_t version = whole.version;
  CHECK(version > 0);
  f.plane->serve(delta_poll(3, 2, version));
  f.plane->serve(f.push(4, w, 2, {0, 0, -3, 0}));  // {1, 1, 4, 1}
  f.io.drain();
  REQUIRE(f.writer.ids() == std::vector<uint64_t>{2, 1, 4, 3});
  const Answer& delta = f.writer.taken[3];
  CHECK(delta.format == WireFormat::topk);
  CHECK(delta.version == version + 1);
  std::vector<float> copy = {1, 1, 1, 1};
  apply_delta(DType::float32, f.writer.bytes[3], std::as_writable_bytes(std::span(copy)));
  CHECK(copy == std::vector<float>{1, 1, 4, 1});
  // A variable this shard does not host: its values are refused as a poll's are.
  Request stranger = delta_poll(5, 1, 0);
  stranger.variable = 7;
  f.plane->serve(stranger);
  f.io.drain();
  REQUIRE(f.writer.taken.size() == 5);
  CHECK(f.writer.taken[4].kind == AnswerKind::error);
}
