// SPDX-License-Identifier: Apache-2.0
// Bad input over real RPC and over the data stream: each request gets a typed error naming
// the problem, the variable is untouched, and the shard keeps serving every other client.
#include <cstring>

#include <doctest/doctest.h>

#include "common/error.h"
#include "net/wire_convert.h"
#include "server/shard_service.h"
#include "tests/cluster.h"
#include "tests/link_requests.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 16;
constexpr uint64_t kWaitingPollLimit = 4;
const std::string kToken = "s3cret";

// Runs the test case twice: its pushes and polls as RPC calls, then over a data stream (the
// same requests as frames, link/data_channel.h). Returns which run this is.
bool over_data_stream() {
  bool data_stream = false;
  SUBCASE("as RPC calls") {
    data_stream = false;
  }
  SUBCASE("over a data stream") {
    data_stream = true;
  }
  return data_stream;
}

struct BadInputFixture {
  bool data_stream;
  Cluster cluster{config()};
  ShardLink& link = cluster.open_link(0);
  VariableId id;
  std::vector<float> initial = std::vector<float>(kElements, 2.f);
  std::vector<float> expected = initial;  // the value every accepted push so far leads to
  uint32_t next_good_worker = 1;

  static DeploymentConfig config() {
    DeploymentConfig c = cluster_config(1, 4, Mode::async);
    c.auth_token = kToken;
    c.limits.max_message_bytes = 4096;
    c.limits.max_waiting_polls = kWaitingPollLimit;
    c.limits.max_token_bytes = 64;
    c.optimizer.lr = 1.0;
    return c;
  }

  explicit BadInputFixture(bool over_data_stream = false) : data_stream(over_data_stream) {
    connect(link, WorkerId(0));
    id = cluster.run(link.register_part(spec(), true, {0, kElements}, bytes(initial)));
  }

  // Connects `to` as `worker`, with a data stream in the data stream run.
  void connect(ShardLink& to, WorkerId worker) {
    cluster.run(to.connect(worker, kToken));
    if (data_stream) cluster.run(cluster.open_data_stream(to, 0));
    CHECK(to.has_data_stream() == data_stream);
  }

  static VariableSpec spec() { return {"fc6/w", {kElements}, DType::float32, Priority(0), {}}; }
  static std::span<const std::byte> bytes(const std::vector<float>& v) {
    return std::as_bytes(std::span(v));
  }

  // Runs `call`, expecting a psched::Error with `code` whose message contains `text`.
  template <typename T>
  void expect_error(kj::Promise<T> call, ErrorCode code, const std::string& text) {
    try {
      cluster.run(kj::mv(call));
      FAIL("the call succeeded");
    } catch (const kj::Exception& e) {
      Error error = from_kj_exception(e);
      CHECK_MESSAGE(error.code() == code, error.what());
      CHECK_MESSAGE(std::string(error.what()).find(text) != std::string::npos, error.what());
    }
  }

  std::vector<float> current_value() {
    std::vector<float> out(kElements);
    cluster.run(
        link.pull(id, {0, kElements}, reinterpret_cast<std::byte*>(out.data()), kElements * 4));
    return out;
  }

  // Another worker on its own connection pushes and polls its step 1 successfully.
  void check_others_served() {
    ShardLink& other = cluster.open_link(0);
    cluster.run(other.connect(WorkerId(next_good_worker++), kToken));
    std::vector<float> grad(kElements, 1.f), fresh(kElements);
    cluster.run(push(other, id, Step(1), {0, kElements}, DType::float32, bytes(grad)));
    cluster.run(poll(other, id, Step(1), {0, kElements}, reinterpret_cast<std::byte*>(fresh.data()),
                     kElements * 4));
    for (float& x : expected) x -= 1.f;  // sgd, lr 1
    CHECK(fresh == expected);
  }

  // Another connection (worker 3) with limits.max_waiting_polls polls of step 1 waiting;
  // their values are due in out[0, limit), and out has one slot more.
  struct FullWaiter {
    ShardLink& link;
    std::vector<std::vector<float>> out;
    std::vector<kj::Promise<int64_t>> waiting;
  };
  FullWaiter full_waiter() {
    FullWaiter w{
        cluster.open_link(0),
        std::vector<std::vector<float>>(kWaitingPollLimit + 1, std::vector<float>(kElements)),
        {}};
    connect(w.link, WorkerId(3));
    for (uint64_t i = 0; i < kWaitingPollLimit; ++i)
      w.waiting.push_back(poll(w.link, id, Step(1), {0, kElements},
                               reinterpret_cast<std::byte*>(w.out[i].data()), kElements * 4));
    return w;
  }

  void check_untouched_and_serving() {
    CHECK(current_value() == expected);
    check_others_served();
  }
};

}  // namespace

TEST_CASE("a push to an unknown variable is rejected naming the id") {
  BadInputFixture f(over_data_stream());
  std::vector<float> grad(4, 1.f);
  f.expect_error(push(f.link, VariableId(42), Step(1), {0, 4}, DType::float32, f.bytes(grad)),
                 ErrorCode::unknown_variable, "no variable or table with id 42");
  f.check_untouched_and_serving();
}

TEST_CASE("a push whose bytes are not whole elements is a shape mismatch") {
  BadInputFixture f(over_data_stream());
  std::vector<std::byte> odd(6);
  f.expect_error(push(f.link, f.id, Step(1), {0, 1}, DType::float32, odd),
                 ErrorCode::shape_mismatch, "6 bytes of data are not whole float32 elements");
  f.check_untouched_and_serving();
}

TEST_CASE("a push of the wrong dtype is a dtype mismatch") {
  BadInputFixture f(over_data_stream());
  std::vector<double> grad(4, 1.0);
  f.expect_error(
      push(f.link, f.id, Step(1), {0, 4}, DType::float64, std::as_bytes(std::span(grad))),
      ErrorCode::dtype_mismatch, "dtype float64 but registered as float32");
  f.check_untouched_and_serving();
}

TEST_CASE("a push reaching past the variable is out of range") {
  BadInputFixture f(over_data_stream());
  std::vector<float> grad(4, 1.f);
  f.expect_error(push(f.link, f.id, Step(1), {14, 18}, DType::float32, f.bytes(grad)),
                 ErrorCode::offset_out_of_range,
                 "push to variable 'fc6/w' rejected: elements [14, 18) are outside");
  f.check_untouched_and_serving();
}

TEST_CASE("a refused pushPoll names the problem and leaves the variable untouched") {
  BadInputFixture f(over_data_stream());
  std::vector<float> grad(4, 1.f), fresh(4);
  auto* out = reinterpret_cast<std::byte*>(fresh.data());
  f.expect_error(
      push_poll(f.link, VariableId(42), Step(1), {0, 4}, DType::float32, f.bytes(grad), out, 16),
      ErrorCode::unknown_variable, "no variable or table with id 42");
  f.expect_error(push_poll(f.link, f.id, Step(1), {14, 18}, DType::float32, f.bytes(grad), out, 16),
                 ErrorCode::offset_out_of_range, "elements [14, 18) are outside");
  f.check_untouched_and_serving();
}

TEST_CASE("a pushPoll answers the fresh value of its own push") {
  BadInputFixture f(over_data_stream());
  std::vector<float> grad(4, 1.f), fresh(4);
  int64_t at = f.cluster.run(push_poll(f.link, f.id, Step(1), {4, 8}, DType::float32, f.bytes(grad),
                                       reinterpret_cast<std::byte*>(fresh.data()), 16));
  CHECK(at > 0);
  CHECK(fresh == std::vector<float>(4, 1.f));  // 2 - lr 1 x 1
  for (int i = 4; i < 8; ++i) f.expected[i] -= 1.f;
  f.check_untouched_and_serving();
}

TEST_CASE("a push and a poll for a step from the future are rejected") {
  BadInputFixture f(over_data_stream());
  std::vector<float> grad(kElements, 1.f), out(kElements);
  f.expect_error(push(f.link, f.id, Step(3), {0, kElements}, DType::float32, f.bytes(grad)),
                 ErrorCode::step_from_future, "step 3 from the future (next step is 1)");
  f.expect_error(poll(f.link, f.id, Step(2), {0, kElements},
                      reinterpret_cast<std::byte*>(out.data()), kElements * 4),
                 ErrorCode::step_from_future, "step 2 from the future");
  f.check_untouched_and_serving();
}

TEST_CASE("a wrong token is refused at connect") {
  BadInputFixture f;
  ShardLink& intruder = f.cluster.open_link(0);
  f.expect_error(intruder.connect(WorkerId(3), "guess"), ErrorCode::bad_token, "wrong auth token");
  f.expect_error(push(intruder, f.id, Step(1), {0, 1}, DType::float32, {}),
                 ErrorCode::invalid_argument, "session is not open");
  f.check_untouched_and_serving();
}

TEST_CASE("tokens compare equal only when every byte and the length match") {
  CHECK(constant_time_equal("s3cret", "s3cret"));
  CHECK(constant_time_equal("", ""));
  for (const char* other : {"s3creT", "S3cret", "s3cre", "s3crett", ""})
    CHECK_FALSE(constant_time_equal(other, "s3cret"));
  CHECK_FALSE(constant_time_equal(std::string_view("s3cre\0", 6), "s3cret"));
  CHECK_FALSE(constant_time_equal("s3cret", std::string_view("s3cret\0", 7)));
}

TEST_CASE("a worker id outside the job is refused at connect") {
  BadInputFixture f;
  ShardLink& stranger = f.cluster.open_link(0);
  f.expect_error(stranger.connect(WorkerId(7), kToken), ErrorCode::invalid_argument,
                 "worker id 7 is not below the job's 4 workers");
}

TEST_CASE(
    "a message over the size limit is rejected and a far larger one drops only its connection") {
  BadInputFixture f;
  std::vector<float> big(2048, 1.f);  // 8 KiB > the 4 KiB limit
  f.expect_error(push(f.link, f.id, Step(1), {0, 2048}, DType::float32, f.bytes(big)),
                 ErrorCode::message_too_large, "exceed the message limit of 4096 bytes");
  f.check_untouched_and_serving();

  ShardLink& flooder = f.cluster.open_link(0, 64 << 20);  // a client that ignores the limit
  f.cluster.run(flooder.connect(WorkerId(3), kToken));
  std::vector<float> huge(1 << 20, 1.f);  // 4 MiB: past what the reader accepts at all
  try {
    f.cluster.run(push(flooder, f.id, Step(1), {0, huge.size()}, DType::float32, f.bytes(huge)));
    FAIL("the oversized push succeeded");
  } catch (const kj::Exception& e) {
    CHECK_MESSAGE(std::string(e.getDescription().cStr()).find("too large") != std::string::npos,
                  std::string(e.getDescription().cStr()));
  }
  f.check_untouched_and_serving();
}

TEST_CASE("re-registering a name with a different spec is a conflict and keeps the variable") {
  BadInputFixture f;
  VariableSpec other = BadInputFixture::spec();
  other.shape = {4, 4, 1};
  f.expect_error(f.link.register_part(other, true, {0, kElements}, f.bytes(f.initial)),
                 ErrorCode::spec_conflict,
                 "'fc6/w' rejected: it is registered with a different spec");
  std::vector<float> same(kElements, 9.f);
  CHECK(f.cluster.run(f.link.register_part(BadInputFixture::spec(), true, {0, kElements},
                                           f.bytes(same))) == f.id);
  f.check_untouched_and_serving();
}

TEST_CASE("a registration with a wrong-sized initial value is a shape mismatch") {
  BadInputFixture f;
  VariableSpec spec{"fc7/w", {8}, DType::float32, Priority(0), {}};
  std::vector<float> short_value(5);
  f.expect_error(f.link.register_part(spec, true, {0, 8}, f.bytes(short_value)),
                 ErrorCode::shape_mismatch, "initial value has 20 bytes, expected 32");
  f.check_untouched_and_serving();
}

TEST_CASE("a registration with a bad optimizer setting names the field") {
  BadInputFixture f;
  VariableSpec spec{"fc8/w", {2}, DType::float32, Priority(0), {}};
  spec.optimizer.kind = optim::OptimizerKind::adam;
  spec.optimizer.beta1 = 1.5;
  std::vector<float> value(2);
  f.expect_error(f.link.register_part(spec, false, {0, 2}, f.bytes(value)),
                 ErrorCode::invalid_argument, "beta1");
  f.check_untouched_and_serving();
}

TEST_CASE("a dropped connection's waiting poll is forgotten and the shard serves the others") {
  BadInputFixture f(over_data_stream());
  ShardLink& doomed = f.cluster.open_link(0);
  f.connect(doomed, WorkerId(3));
  std::vector<float> out(kElements);
  auto waiting = poll(doomed, f.id, Step(1), {0, kElements},
                      reinterpret_cast<std::byte*>(out.data()), kElements * 4);
  auto polls_waiting = [&] {
    ShardStats stats;
    f.cluster.host().shard(0).stats([&](ShardStats s) { stats = s; });
    f.cluster.settle();
    return stats.polls_waiting;
  };
  f.cluster.settle();
  CHECK(polls_waiting() == 1);
  waiting = nullptr;  // the worker's process dies: its call and its link go
  f.cluster.drop_link(doomed);
  f.cluster.settle();
  CHECK(polls_waiting() == 0);
  f.check_untouched_and_serving();
}

TEST_CASE("a token over the length limit is refused at connect naming the limit") {
  BadInputFixture f;
  ShardLink& link = f.cluster.open_link(0);
  f.expect_error(link.connect(WorkerId(3), std::string(65, 't')), ErrorCode::invalid_argument,
                 "token of 65 bytes is over the limit of 64 (limits.max_token_bytes)");
  f.check_untouched_and_serving();
}

TEST_CASE("a registration over the name or shape limits names the limit") {
  BadInputFixture f;
  std::vector<float> value(2);
  VariableSpec long_name{std::string(1025, 'n'), {2}, DType::float32, Priority(0), {}};
  f.expect_error(f.link.register_part(long_name, true, {0, 2}, f.bytes(value)),
                 ErrorCode::invalid_argument, "(limits.max_name_bytes)");
  VariableSpec deep{"deep", std::vector<uint64_t>(33, 1), DType::float32, Priority(0), {}};
  f.expect_error(f.link.register_part(deep, true, {0, 1}, f.bytes(value)),
                 ErrorCode::invalid_argument, "(limits.max_shape_dims)");
  // 2^62 float32 elements: 2^64 bytes, which would wrap to an empty initial value.
  VariableSpec huge{"huge", {1ull << 62}, DType::float32, Priority(0), {}};
  f.expect_error(f.link.register_part(huge, true, {0, 1ull << 62}, {}), ErrorCode::invalid_argument,
                 "shape [4611686018427387904] has more than");
  f.check_untouched_and_serving();
}

TEST_CASE("a poll past the connection's waiting poll limit is overloaded; answers free room") {
  BadInputFixture f(over_data_stream());
  auto [waiter, out, waiting] = f.full_waiter();
  f.expect_error(poll(waiter, f.id, Step(1), {0, kElements},
                      reinterpret_cast<std::byte*>(out.back().data()), kElements * 4),
                 ErrorCode::overloaded,
                 "4 polls of this connection are waiting, the limit "
                 "(limits.max_waiting_polls");
  // The worker's own push answers its waiting polls; then it may poll again.
  std::vector<float> grad(kElements, 1.f);
  f.cluster.run(push(waiter, f.id, Step(1), {0, kElements}, DType::float32, f.bytes(grad)));
  for (auto& poll : waiting) f.cluster.run(kj::mv(poll));
  f.cluster.run(poll(waiter, f.id, Step(1), {0, kElements},
                     reinterpret_cast<std::byte*>(out.back().data()), kElements * 4));
  for (float& x : f.expected) x -= 1.f;
  f.check_untouched_and_serving();
}

TEST_CASE("a pushPoll past the connection's waiting poll limit is overloaded and applies nothing") {
  BadInputFixture f(over_data_stream());
  auto [waiter, out, waiting] = f.full_waiter();
  std::vector<float> grad(kElements, 1.f);
  f.expect_error(push_poll(waiter, f.id, Step(1), {0, kElements}, DType::float32, f.bytes(grad),
                           reinterpret_cast<std::byte*>(out.back().data()), kElements * 4),
                 ErrorCode::overloaded, "(limits.max_waiting_polls");
  CHECK(f.current_value() == f.expected);
  // The same push, plain, answers the waiting polls.
  f.cluster.run(push(waiter, f.id, Step(1), {0, kElements}, DType::float32, f.bytes(grad)));
  for (auto& poll : waiting) f.cluster.run(kj::mv(poll));
  for (float& x : f.expected) x -= 1.f;
  f.check_untouched_and_serving();
}

TEST_CASE(
    "a connect past the shard's connection limit is refused as overloaded; others are served") {
  DeploymentConfig config = BadInputFixture::config();
  config.limits.max_connections = 2;
  Cluster cluster(config);
  ShardLink& first = cluster.open_link(0);
  ShardLink& second = cluster.open_link(0);
  cluster.run(first.connect(WorkerId(0), kToken));
  cluster.run(second.connect(WorkerId(1), kToken));
  ShardLink& third = cluster.open_link(0);
  try {
    cluster.run(third.connect(WorkerId(2), kToken));
    FAIL("a third connection was served");
  } catch (const kj::Exception& e) {
    Error error = from_kj_exception(e);
    CHECK(error.code() == ErrorCode::overloaded);
    CHECK(std::string(error.what()).find("is at max_connections (2") != std::string::npos);
  }
  cluster.drop_link(first);
  cluster.settle();
  ShardLink& again = cluster.open_link(0);
  cluster.run(again.connect(WorkerId(2), kToken));
}
