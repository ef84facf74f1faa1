// SPDX-License-Identifier: Apache-2.0
// The data stream (net/data_frame.h) fed hand-made frames, as a faulty or hostile worker would
// send them: a wrong key, frames of unknown kind, bodies over the limit, reused ids, cancels.
// Each gets an answer naming the problem (or the stream is closed after one), the variable is
// untouched, and the shard goes on serving. What ShardLink sends itself is covered, over both
// RPC and the data stream, by bad_input_test.cc.
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "common/kj_error.h"
#include "compression/codec.h"
#include "net/data_frame.h"
#include "net/psched.capnp.h"
#include "net/rpc_connection.h"
#include "server/receive_buffers.h"
#include "server/shard_trace.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 16;
constexpr uint64_t kMessageLimit = 4096;
const std::string kToken = "s3cret";

DeploymentConfig config(uint64_t message_limit) {
  DeploymentConfig c = cluster_config(1, 2, Mode::async);
  c.auth_token = kToken;
  c.limits.max_message_bytes = message_limit;
  c.optimizer.lr = 1.0;
  return c;
}

std::span<const std::byte> bytes(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

struct AnswerFrame {
  AnswerHeader header;
  std::string body;
};

// A worker that speaks RPC with Cap'n Proto's own client and writes data frames by hand.
struct RawWorker {
  Cluster& cluster;
  kj::Own<RpcConnection> rpc;
  wire::Session::Client session = nullptr;
  kj::Own<kj::AsyncIoStream> data;

  RawWorker(Cluster& c, WorkerId worker, uint64_t message_limit = kMessageLimit) : cluster(c) {
    auto pipe = kj::newTwoWayPipe();
    cluster.host().listener(0).serve(kj::mv(pipe.ends[0]));
    rpc = kj::heap<RpcConnection>(kj::mv(pipe.ends[1]), reader_options(message_limit));
    auto request = rpc->bootstrap().castAs<wire::Shard>().connectRequest();
    request.setWorkerId(worker.value);
    request.setToken(kToken);
    session = cluster.run(request.send()).getSession();
  }

  std::string key() {
    auto response = cluster.run(session.openDataStreamRequest().send());
    auto key = response.getKey();
    return std::string(reinterpret_cast<const char*>(key.begin()), key.size());
  }

  // Opens a data stream presenting `key`.
  void open_data(const std::string& key) {
    auto pipe = kj::newTwoWayPipe();
    cluster.host().listener(0).serve(kj::mv(pipe.ends[0]));
    data = kj::mv(pipe.ends[1]);
    write(std::string(kDataPreface) + key);
  }

  // Opens a data stream with a fresh key of its session and checks the shard accepted it.
  void open_accepted_data() {
    open_data(key());
    CHECK(read().header.kind == wire::AnswerKind::READY);
  }

  void write(const std::string& bytes) { cluster.run(data->write(bytes.data(), bytes.size())); }
  void send(const RequestHeader& request, std::span<const std::byte> body = {}) {
    FrameHeaderBytes header = encode(request);
    std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
    frame.append(reinterpret_cast<const char*>(body.data()), body.size());
    write(frame);
  }

  AnswerFrame read() {
    FrameHeaderBytes header;
    cluster.run(data->read(header.data(), header.size()));
    std::optional<AnswerHeader> answer = decode_answer(header);
    REQUIRE(answer);
    std::string body(answer->body_bytes, '\0');
    cluster.run(data->read(body.data(), body.size()));
    return {*answer, body};
  }

  // True when the shard closed the data stream.
  bool closed() {
    char byte;
    return cluster.run(data->tryRead(&byte, 1, 1)) == 0;
  }
};

// A shard with a variable of `elements` float32 (all 2.0), and a worker connected by RPC.
struct DataStreamFixture {
  uint64_t elements;
  Cluster cluster;
  RawWorker worker;
  VariableId id;

  explicit DataStreamFixture(uint64_t elements_ = kElements, uint64_t message_limit = kMessageLimit)
      : elements(elements_),
        cluster(config(message_limit)),
        worker(cluster, WorkerId(0), message_limit) {
    auto request = worker.session.registerRequest();
    auto spec = request.initSpec();
    spec.setName("w");
    spec.initShape(1).set(0, elements);
    spec.setUseServerOptimizer(true);
    request.setEnd(elements);
    std::vector<float> initial(elements, 2.f);
    request.setInitialValue(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(initial.data()), elements * 4));
    id = VariableId(cluster.run(request.send()).getVariable());
  }

  RequestHeader push(uint64_t request_id, uint64_t step, uint64_t elements) const {
    return {wire::RequestKind::PUSH, DType::float32, id.value, request_id, step, 0, elements * 4};
  }
  RequestHeader poll(uint64_t request_id, uint64_t step) const {
    return {wire::RequestKind::POLL, DType::float32, id.value, request_id, step, 0, 0, elements};
  }

  std::vector<float> current_value() {
    auto request = worker.session.pullRequest();
    request.setVariable(id.value);
    request.setCount(elements);
    auto response = cluster.run(request.send());  // owns the bytes getValue() views
    auto value = response.getValue();
    std::vector<float> out(elements);
    std::memcpy(out.data(), value.begin(), value.size());
    return out;
  }

  // Another worker opens its own data stream, pushes step 1 and gets its fresh value.
  void check_others_served() {
    RawWorker other(cluster, WorkerId(1));
    other.open_accepted_data();
    std::vector<float> grad(kElements, 1.f);
    other.send({wire::RequestKind::PUSH_POLL, DType::float32, id.value, 7, 1, 0, kElements * 4},
               bytes(grad));
    AnswerFrame answer = other.read();
    CHECK(answer.header.kind == wire::AnswerKind::VALUE);
    CHECK(answer.header.id == 7);
    REQUIRE(answer.body.size() == kElements * 4);
  }

  uint64_t polls_waiting() {
    ShardStats stats;
    cluster.host().shard(0).stats([&](ShardStats s) { stats = s; });
    cluster.settle();
    return stats.polls_waiting;
  }
};

void check_error(const AnswerFrame& answer, uint64_t id, const std::string& code,
                 const std::string& text) {
  CHECK(answer.header.kind == wire::AnswerKind::ERROR);
  CHECK(answer.header.id == id);
  CHECK_MESSAGE(answer.body.starts_with("[" + code + "] "), answer.body);
  CHECK_MESSAGE(answer.body.find(text) != std::string::npos, answer.body);
}

}  // namespace

TEST_CASE("frame headers read back as written, and unknown kinds are refused") {
  RequestHeader request{wire::RequestKind::PUSH_POLL, DType::float64, 7, 1ull << 40, 12, 34, 56};
  std::string why;
  std::optional<RequestHeader> back = decode_request(encode(request), why);
  REQUIRE(back);
  CHECK(back->kind == request.kind);
  CHECK(back->dtype == request.dtype);
  CHECK(back->variable == 7);
  CHECK(back->id == 1ull << 40);
  CHECK(back->step == 12);
  CHECK(back->offset == 34);
  CHECK(back->body_bytes == 56);
  CHECK(back->count == 0);
  RequestHeader poll{wire::RequestKind::POLL, DType::float32, 7, 1, 12, 34, 0, 78};
  std::optional<RequestHeader> poll_back = decode_request(encode(poll), why);
  REQUIRE(poll_back);
  CHECK(poll_back->count == 78);
  CHECK(poll_back->body_bytes == 0);

  AnswerHeader answer{wire::AnswerKind::VALUE, 9, 3, -5, 64};
  std::optional<AnswerHeader> answered = decode_answer(encode(answer));
  REQUIRE(answered);
  CHECK(answered->id == 9);
  CHECK(answered->applied_step == 3);
  CHECK(answered->applied_at_ns == -5);
  CHECK(answered->body_bytes == 64);

  FrameHeaderBytes bad = encode(request);
  bad[0] = std::byte{9};
  CHECK_FALSE(decode_request(bad, why));
  CHECK(why == "unknown request kind 9");
  bad = encode(request);
  bad[1] = std::byte{2};
  CHECK_FALSE(decode_request(bad, why));
  CHECK(why == "unknown dtype 2");
  bad[0] = std::byte{0};
  CHECK_FALSE(decode_answer(bad));
}

TEST_CASE("a data stream with an unknown or used key is refused and closed") {
  DataStreamFixture f;
  f.worker.open_data(std::string(kDataKeyBytes, 'x'));
  check_error(f.worker.read(), 0, "bad_token", "its key is unknown or used");
  CHECK(f.worker.closed());

  std::string key = f.worker.key();
  f.worker.open_data(key);
  CHECK(f.worker.read().header.kind == wire::AnswerKind::READY);
  RawWorker thief(f.cluster, WorkerId(1));
  thief.open_data(key);
  check_error(thief.read(), 0, "bad_token", "its key is unknown or used");
  f.check_others_served();
}

TEST_CASE("a frame of unknown kind is answered naming it and the stream closed; nothing changes") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  FrameHeaderBytes header = encode(f.push(1, 1, kElements));
  header[0] = std::byte{42};
  f.worker.write(std::string(reinterpret_cast<const char*>(header.data()), header.size()));
  check_error(f.worker.read(), 0, "invalid_argument", "unknown request kind 42");
  CHECK(f.worker.closed());
  CHECK(f.current_value() == std::vector<float>(kElements, 2.f));
  f.check_others_served();
}

TEST_CASE("a push frame over the message limit is refused unread and the stream closed") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  f.worker.send(f.push(5, 1, kMessageLimit));  // its body, never sent, is not waited for
  check_error(f.worker.read(), 5, "message_too_large", "(limits.max_message_bytes)");
  CHECK(f.worker.closed());
  CHECK(f.current_value() == std::vector<float>(kElements, 2.f));
  f.check_others_served();
}

TEST_CASE("bad pushes are answered with their error and the stream goes on") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  std::vector<float> grad(kElements, 1.f);
  RequestHeader odd = f.push(1, 1, kElements);
  odd.body_bytes = 6;
  f.worker.send(odd, bytes(grad).first(6));
  check_error(f.worker.read(), 1, "shape_mismatch", "6 bytes of data are not whole float32");
  RequestHeader outside = f.push(2, 1, kElements);
  outside.offset = 8;
  f.worker.send(outside, bytes(grad));
  check_error(f.worker.read(), 2, "offset_out_of_range", "are outside");
  CHECK(f.current_value() == std::vector<float>(kElements, 2.f));

  f.worker.send(f.push(3, 1, kElements), bytes(grad));
  AnswerFrame receipt = f.worker.read();
  CHECK(receipt.header.kind == wire::AnswerKind::RECEIPT);
  CHECK(receipt.header.id == 3);
  CHECK(f.current_value() == std::vector<float>(kElements, 1.f));
}

TEST_CASE("compressed pushes that do not decode are refused naming why; the stream goes on") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  std::vector<float> grad(kElements, 1.f);
  std::vector<std::byte> body;
  encode(WireFormat::topk, DType::float32, bytes(grad), {.count = 2}, body);
  RequestHeader topk = f.push(1, 1, kElements);
  topk.format = WireFormat::topk;
  topk.body_bytes = body.size() - 1;
  f.worker.send(topk, std::span<const std::byte>(body).first(body.size() - 1));
  check_error(f.worker.read(), 1, "invalid_argument", "malformed topk push");
  encode(WireFormat::fp16, DType::float32, bytes(std::vector<float>(kElements, 1e6f)), {}, body);
  RequestHeader overflow = f.push(2, 1, kElements);
  overflow.format = WireFormat::fp16;
  overflow.body_bytes = body.size();
  f.worker.send(overflow, body);
  check_error(f.worker.read(), 2, "invalid_argument", "decodes to an infinity or a NaN");
  RequestHeader sparse_value = f.poll(3, 1);
  sparse_value.value_format = WireFormat::topk;
  f.worker.send(sparse_value);
  check_error(f.worker.read(), 3, "invalid_argument", "values cannot travel as topk");
  CHECK(f.current_value() == std::vector<float>(kElements, 2.f));

  encode(WireFormat::bf16, DType::float32, bytes(grad), {}, body);
  RequestHeader bf16 = f.push(4, 1, kElements);
  bf16.format = WireFormat::bf16;
  bf16.body_bytes = body.size();
  f.worker.send(bf16, body);
  CHECK(f.worker.read().header.kind == wire::AnswerKind::RECEIPT);
  CHECK(f.current_value() == std::vector<float>(kElements, 1.f));

  FrameHeaderBytes unknown = encode(f.push(5, 2, kElements));
  unknown[2] = std::byte{9};
  f.worker.write(std::string(reinterpret_cast<const char*>(unknown.data()), unknown.size()));
  check_error(f.worker.read(), 0, "invalid_argument", "unknown wire format 9");
  CHECK(f.worker.closed());
  f.check_others_served();
}

TEST_CASE("a Cap'n Proto push of a dtype not on the wire is refused naming it; nothing changes") {
  DataStreamFixture f;
  std::vector<float> grad(kElements, 1.f);
  auto request = f.worker.session.pushRequest();
  request.setVariable(f.id.value);
  request.setStep(1);
  request.setDtype(static_cast<wire::DType>(7));
  request.setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(grad.data()),
                                      grad.size() * sizeof(float)));
  try {
    f.cluster.run(request.send());
    FAIL("the push was accepted");
  } catch (const kj::Exception& e) {
    Error error = from_kj_exception(e);
    CHECK(error.code() == ErrorCode::dtype_mismatch);
    CHECK_MESSAGE(std::string(error.what()).find("unknown dtype number 7") != std::string::npos,
                  error.what());
  }
  CHECK(f.current_value() == std::vector<float>(kElements, 2.f));
  f.check_others_served();
}

TEST_CASE("a poll id already waiting is refused; a cancel withdraws the waiting poll") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  f.worker.send(f.poll(1, 1));
  f.cluster.settle();
  CHECK(f.polls_waiting() == 1);
  f.worker.send(f.poll(1, 1));
  check_error(f.worker.read(), 1, "invalid_argument", "request id 1 is already waiting");
  f.worker.send({wire::RequestKind::CANCEL, DType::float32, 0, 1, 0, 0, 0});
  f.cluster.settle();
  CHECK(f.polls_waiting() == 0);
  // The push that would have answered it is receipted, and no value comes for the cancelled
  // poll: the next answer is the receipt.
  std::vector<float> grad(kElements, 1.f);
  f.worker.send(f.push(2, 1, kElements), bytes(grad));
  AnswerFrame next = f.worker.read();
  CHECK(next.header.kind == wire::AnswerKind::RECEIPT);
  CHECK(next.header.id == 2);
  f.check_others_served();
}

TEST_CASE("a dropped data stream's waiting polls are withdrawn") {
  DataStreamFixture f;
  f.worker.open_accepted_data();
  f.worker.send(f.poll(1, 1));
  f.worker.send(f.poll(2, 1));
  f.cluster.settle();
  CHECK(f.polls_waiting() == 2);
  f.worker.data = nullptr;
  f.cluster.settle();
  CHECK(f.polls_waiting() == 0);
  f.check_others_served();
}

TEST_CASE("a traced shard records each applied push and answered poll, phases in order") {
  DataStreamFixture f;
  CHECK(f.cluster.host().trace(0) == nullptr);
  f.cluster.host().start_tracing(16);
  f.worker.open_accepted_data();
  std::vector<float> grad(kElements, 1.f);
  RequestHeader outside = f.push(1, 1, kElements);
  outside.offset = 8;
  f.worker.send(outside, bytes(grad));  // refused: not traced
  check_error(f.worker.read(), 1, "offset_out_of_range", "are outside");
  f.worker.send(f.push(2, 1, kElements), bytes(grad));
  CHECK(f.worker.read().header.kind == wire::AnswerKind::RECEIPT);
  f.worker.send(f.poll(3, 1));
  CHECK(f.worker.read().header.kind == wire::AnswerKind::VALUE);

  const ShardTrace* trace = f.cluster.host().trace(0);
  REQUIRE(trace != nullptr);
  REQUIRE(trace->size() == 2);
  for (const ShardTrace::Request& r : trace->requests()) {
    CHECK(r.worker == WorkerId(0));
    CHECK(r.variable == f.id);
    CHECK(r.step == Step(1));
    CHECK(r.range == ElementRange{0, kElements});
    CHECK(r.bytes == kElements * 4);
    CHECK(r.begin <= r.middle);
    CHECK(r.middle <= r.end);
  }
  const ShardTrace::Request& push = trace->requests()[0];
  const ShardTrace::Request& poll = trace->requests()[1];
  CHECK(push.kind == ShardTrace::Kind::push);
  CHECK(poll.kind == ShardTrace::Kind::poll);
  CHECK(push.end <= poll.middle);  // the value was ready once the push was applied

  nlohmann::json events = nlohmann::json::array();
  trace->append_events(events, 3, "shard 0");
  std::vector<std::string> slices;
  for (const auto& e : events)
    if (e["ph"] == "X") slices.push_back(e["name"]);
  std::string id = std::to_string(f.id.value);
  CHECK(slices == std::vector<std::string>{"push v" + id + " s1 [0, 16)", "receive", "apply",
                                           "poll v" + id + " s1 [0, 16)", "wait", "answer"});
}

TEST_CASE("a large push's buffer goes back to the shard's pool once applied, and is reused") {
  constexpr uint64_t kLargeBytes = ReceiveBuffers::kPooledFrom;
  DataStreamFixture f(kLargeBytes / 4, 2 * kLargeBytes);
  const ReceiveBuffers& pool = f.cluster.host().receive_buffers(0);
  f.worker.open_accepted_data();
  std::vector<float> grad(f.elements, 1.f);
  for (uint64_t step = 1; step <= 2; ++step) {
    f.worker.send(f.push(step, step, f.elements), bytes(grad));
    CHECK(f.worker.read().header.kind == wire::AnswerKind::RECEIPT);
    CHECK(pool.kept_bytes() == kLargeBytes);  // one buffer, kept again after each push
  }
}

TEST_CASE(
    "a data stream silent inside a frame is dropped after the stall timeout; one slow "
    "inside a frame, or silent between frames, is served") {
  kj::TimerImpl clock(kj::origin<kj::TimePoint>());  // outlives the shard's sessions
  DataStreamFixture f;
  f.cluster.host().listener(0).use_timer(clock);
  const uint64_t stall = f.cluster.config().limits.stall_timeout_seconds;
  auto wait_seconds = [&](uint64_t seconds) {
    for (uint64_t s = 0; s < seconds; ++s) {
      clock.advanceTo(clock.now() + kj::SECONDS);
      f.cluster.settle();
    }
  };
  f.worker.open_accepted_data();
  wait_seconds(2 * stall);  // between frames: as long as it likes

  // One frame in four pieces, each stall - 1 seconds after the one before.
  std::vector<float> grad(kElements, 1.f);
  RequestHeader request = f.push(1, 1, kElements);
  request.kind = wire::RequestKind::PUSH_POLL;
  FrameHeaderBytes header = encode(request);
  std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
  frame.append(reinterpret_cast<const char*>(grad.data()), grad.size() * sizeof(float));
  const size_t cuts[] = {0, header.size() / 2, header.size(), header.size() + 20, frame.size()};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    if (i > 0) wait_seconds(stall - 1);
    f.worker.write(frame.substr(cuts[i], cuts[i + 1] - cuts[i]));
  }
  AnswerFrame answer = f.worker.read();
  CHECK(answer.header.kind == wire::AnswerKind::VALUE);
  CHECK(answer.header.id == 1);
  CHECK(f.current_value() == std::vector<float>(kElements, 1.f));  // 2 - lr 1 x 1

  // Half a header, then silence: dropped once the timeout has passed, not before.
  f.worker.write(frame.substr(0, header.size() / 2));
  char byte;
  auto closing = f.worker.data->tryRead(&byte, 1, 1);
  wait_seconds(stall - 1);
  CHECK_FALSE(closing.poll(f.cluster.scope()));
  // The watchdog looks about an eighth of the timeout apart: the drop comes within two looks.
  wait_seconds(2 * (stall / 8 + 1) + 1);
  REQUIRE(closing.poll(f.cluster.scope()));
  CHECK(closing.wait(f.cluster.scope()) == 0);
  CHECK(f.current_value() == std::vector<float>(kElements, 1.f));
  f.check_others_served();
}
