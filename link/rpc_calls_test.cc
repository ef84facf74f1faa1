// SPDX-License-Identifier: Apache-2.0
// RpcCalls against a small Session of the test's own (no shard behind it), over real Cap'n
// Proto RPC on an in-memory pipe: what each call carries, what lands where, and how a refusal
// comes back. One thread, one KJ event loop.
#include "link/rpc_calls.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/kj_error.h"
#include "compression/codec.h"
#include "link/data_path_test_support.h"
#include "net/rpc_connection.h"
#include "net/wire_convert.h"

using namespace psched;
using psched::testing::check_refused;

namespace {

constexpr uint64_t kMaxMessageBytes = 1 << 20;

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

// A Session that records what each push, poll and pushPoll carried and answers as the test
// set it up: with `value`, or with `refusal`.
class RecordingSession final : public wire::Session::Server {
 public:
  struct Call {
    std::string method;
    uint32_t variable = 0;
    uint64_t step = 0;
    uint64_t offset = 0;
    uint64_t count = 0;  // poll's
    DType dtype = DType::float32;
    WireFormat format = WireFormat::none;
    WireFormat value_format = WireFormat::none;
    std::vector<std::byte> data;
    uint64_t base_version = 0;  // poll's, pushPoll's
    uint32_t delta_count = 0;
    std::vector<uint64_t> ids;  // pushRows', pullRows'
  };

  std::vector<Call> calls;
  std::optional<Error> refusal;  // every call is refused with it when set
  std::vector<std::byte> value;  // what poll and pushPoll answer
  int64_t applied_at_ns = 0;
  std::optional<WireFormat> format;  // topk: the answer is a delta
  uint64_t version = 0;

 protected:
  kj::Promise<void> push(PushContext context) override {
    record_push("push", context.getParams());
    if (refusal) return to_kj_exception(*refusal);
    return kj::READY_NOW;
  }
  kj::Promise<void> poll(PollContext context) override {
    auto params = context.getParams();
    calls.push_back({.method = "poll",
                     .variable = params.getVariable(),
                     .step = params.getStep(),
                     .offset = params.getOffset(),
                     .count = params.getCount(),
                     .value_format = from_wire(params.getValueFormat()),
                     .data = {},
                     .base_version = params.getBaseVersion(),
                     .delta_count = params.getDeltaCount()});
    return answer(context.getResults());
  }
  kj::Promise<void> pushPoll(PushPollContext context) override {
    record_push("pushPoll", context.getParams());
    calls.back().value_format = from_wire(context.getParams().getValueFormat());
    return answer(context.getResults());
  }
  kj::Promise<void> pushRows(PushRowsContext context) override {
    auto params = context.getParams();
    auto data = params.getData();
    calls.push_back({.method = "pushRows",
                     .variable = params.getTable(),
                     .step = params.getStep(),
                     .dtype = from_wire(params.getDtype()),
                     .format = from_wire(params.getFormat()),
                     .data = {reinterpret_cast<const std::byte*>(data.begin()),
                              reinterpret_cast<const std::byte*>(data.end())},
                     .ids = ids_of(params.getIds())});
    if (refusal) return to_kj_exception(*refusal);
    return kj::READY_NOW;
  }
  kj::Promise<void> pullRows(PullRowsContext context) override {
    auto params = context.getParams();
    calls.push_back({.method = "pullRows",
                     .variable = params.getTable(),
                     .step = params.getStep(),
                     .value_format = from_wire(params.getValueFormat()),
                     .ids = ids_of(params.getIds())});
    if (refusal) return to_kj_exception(*refusal);
    auto results = context.getResults();
    results.setValue(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(value.data()), value.size()));
    results.setAppliedStep(2);
    return kj::READY_NOW;
  }

 private:
  static std::vector<uint64_t> ids_of(capnp::Data::Reader bytes) {
    std::vector<uint64_t> ids(bytes.size() / sizeof(uint64_t));
    std::memcpy(ids.data(), bytes.begin(), ids.size() * sizeof(uint64_t));
    return ids;
  }
  template <typename Params>
  void record_push(const char* method, Params params) {
    auto data = params.getData();
    calls.push_back({.method = method,
                     .variable = params.getVariable(),
                     .step = params.getStep(),
                     .offset = params.getOffset(),
                     .dtype = from_wire(params.getDtype()),
                     .format = from_wire(params.getFormat()),
                     .data = {reinterpret_cast<const std::byte*>(data.begin()),
                              reinterpret_cast<const std::byte*>(data.end())}});
  }
  template <typename Results>
  kj::Promise<void> answer(Results results) {
    if (refusal) return to_kj_exception(*refusal);
    results.setValue(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(value.data()), value.size()));
    results.setAppliedStep(1);
    results.setAppliedAtNs(applied_at_ns);
    results.setDelta(format == WireFormat::topk);
    results.setVersion(version);
    return kj::READY_NOW;
  }
};

// RpcCalls on a session served by a RecordingSession, the two joined by a pipe.
struct CallsFixture {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TwoWayPipe pipe = kj::newTwoWayPipe();
  RecordingSession* session;  // owned by the server's connection
  RpcConnection server{kj::mv(pipe.ends[1]), served(), reader_options(kMaxMessageBytes)};
  RpcConnection client{kj::mv(pipe.ends[0]), reader_options(kMaxMessageBytes)};
  RpcCalls calls{client.bootstrap().castAs<wire::Session>()};

  capnp::Capability::Client served() {
    auto recording = kj::heap<RecordingSession>();
    session = recording.get();
    return kj::mv(recording);
  }

  // A request for elements [4, 4 + gradient's elements) of variable 3 at step 2; its value
  // lands in `out`.
  static PartitionRequest request(std::span<const std::byte> gradient, std::vector<float>& out) {
    return testing::request_of(gradient, out, Step(2), 4);
  }
};

}  // namespace

TEST_CASE("a push carries its fields and gradient and resolves at the receipt") {
  CallsFixture f;
  std::vector<float> buffer{0.f, 1.f, 2.f, 3.f, 4.f}, out(4);
  std::span<const std::byte> gradient;
  SUBCASE("whole words at a word boundary: referenced into the message") {
    gradient = bytes_of(buffer).first(16);
  }
  SUBCASE("not whole words: copied") {
    gradient = bytes_of(buffer).subspan(4, 12);
    out.resize(3);
  }
  CAPTURE(gradient.size());
  f.calls.push(CallsFixture::request(gradient, out)).wait(f.scope);
  REQUIRE(f.session->calls.size() == 1);
  const RecordingSession::Call& call = f.session->calls[0];
  CHECK(call.method == "push");
  CHECK(call.variable == 3);
  CHECK(call.step == 2);
  CHECK(call.offset == 4);
  CHECK(call.dtype == DType::float32);
  CHECK(call.format == WireFormat::none);
  REQUIRE(call.data.size() == gradient.size());
  CHECK(std::memcmp(call.data.data(), gradient.data(), gradient.size()) == 0);
}

TEST_CASE("a pushPoll's value lands in place with the shard's time, widened from bf16") {
  CallsFixture f;
  std::vector<float> grad(4, 1.f), out(4), value{1.5f, -2.f, 0.25f, 3.f};  // exact in bf16
  PartitionRequest part = CallsFixture::request(bytes_of(grad), out);
  f.session->value.assign(bytes_of(value).begin(), bytes_of(value).end());
  SUBCASE("as float32") {}
  SUBCASE("as bf16") {
    part.value_format = WireFormat::bf16;
    f.session->value.resize(encoded_bytes(WireFormat::bf16, DType::float32, value.size()));
    narrow_values(WireFormat::bf16, DType::float32, bytes_of(value), f.session->value);
  }
  CAPTURE(to_string(part.value_format));
  f.session->applied_at_ns = 987654321;
  Landed landed = f.calls.push_poll(part).wait(f.scope);
  CHECK(landed.applied_at_ns == 987654321);
  CHECK(out == value);
  REQUIRE(f.session->calls.size() == 1);
  CHECK(f.session->calls[0].method == "pushPoll");
  CHECK(f.session->calls[0].value_format == part.value_format);
  CHECK(f.session->calls[0].data.size() == 16);
}

TEST_CASE("a poll asks for its range and its value lands in place") {
  CallsFixture f;
  std::vector<float> out(4), value{4.f, 3.f, 2.f, 1.f};
  f.session->value.assign(bytes_of(value).begin(), bytes_of(value).end());
  f.session->applied_at_ns = 42;
  Landed landed = f.calls.poll(CallsFixture::request({}, out)).wait(f.scope);
  CHECK(landed.applied_at_ns == 42);
  CHECK(out == value);
  REQUIRE(f.session->calls.size() == 1);
  const RecordingSession::Call& call = f.session->calls[0];
  CHECK(call.method == "poll");
  CHECK(call.variable == 3);
  CHECK(call.step == 2);
  CHECK(call.offset == 4);
  CHECK(call.count == 4);
}

TEST_CASE("a delta poll says the version it holds; its delta lands and sets the version") {
  CallsFixture f;
  std::vector<float> out{1, 2, 3, 4}, published = out, current{1, 2, 6, 4};
  std::vector<uint32_t> sent;
  encode_delta(DType::float32, bytes_of(current), std::as_writable_bytes(std::span(published)), 1,
               f.session->value, sent);
  f.session->format = WireFormat::topk;
  f.session->version = 8;
  uint64_t version = 7;
  PartitionRequest part = CallsFixture::request({}, out);
  part.delta = {.version = &version, .count = 1, .ring = 1};
  f.calls.poll(part).wait(f.scope);
  CHECK(out == current);
  CHECK(version == 8);
  REQUIRE(f.session->calls.size() == 1);
  CHECK(f.session->calls[0].base_version == 7);
  CHECK(f.session->calls[0].delta_count == 1);
  // A delta where none was asked for is refused and lands nothing.
  part.delta = {};
  check_refused(f.calls.poll(part), f.scope, ErrorCode::invalid_argument,
                "shard answered in topk where none was asked for");
  CHECK(version == 8);
}

TEST_CASE("a refusal rejects the call with the shard's code and message; nothing lands") {
  CallsFixture f;
  std::vector<float> grad(4, 1.f), out(4);
  f.session->refusal =
      Error(ErrorCode::stale_step, "push to variable 'w' rejected: step 2 was applied already");
  const std::string what = "push to variable 'w' rejected: step 2 was applied already";
  check_refused(f.calls.push(CallsFixture::request(bytes_of(grad), out)), f.scope,
                ErrorCode::stale_step, what);
  check_refused(f.calls.push_poll(CallsFixture::request(bytes_of(grad), out)), f.scope,
                ErrorCode::stale_step, what);
  check_refused(f.calls.poll(CallsFixture::request({}, out)), f.scope, ErrorCode::stale_step, what);
  CHECK(out == std::vector<float>(4, 0.f));
}

TEST_CASE("a value of the wrong size is refused as a shape mismatch and lands nothing") {
  CallsFixture f;
  std::vector<float> out(4), three{1.f, 2.f, 3.f};
  f.session->value.assign(bytes_of(three).begin(), bytes_of(three).end());
  check_refused(f.calls.poll(CallsFixture::request({}, out)), f.scope, ErrorCode::shape_mismatch,
                "shard answered 12 bytes where 16 were expected");
  CHECK(out == std::vector<float>(4, 0.f));
}

TEST_CASE("a push of rows carries its table, step, ids and rows and resolves at the receipt") {
  CallsFixture f;
  const std::vector<uint64_t> ids{8, 2};
  const std::vector<float> rows{1, 2, 3, 4};
  RowsRequest push{.table = VariableId(6),
                   .step = Step(3),
                   .ids = ids,
                   .dim = 2,
                   .gradient = bytes_of(rows),
                   .push = true};
  f.calls.push_rows(push).wait(f.scope);
  REQUIRE(f.session->calls.size() == 1);
  const RecordingSession::Call& call = f.session->calls[0];
  CHECK(call.method == "pushRows");
  CHECK(call.variable == 6);
  CHECK(call.step == 3);
  CHECK(call.ids == ids);
  CHECK(call.data.size() == 16);
  CHECK(std::memcmp(call.data.data(), rows.data(), 16) == 0);
}

TEST_CASE("a pull's rows land each where its place says, widened from bf16") {
  CallsFixture f;
  const std::vector<uint64_t> ids{5, 70};
  const std::vector<uint32_t> at{2, 0};
  const std::vector<float> value{1.5f, -2, 0.25f, 3};
  f.session->value.resize(encoded_bytes(WireFormat::bf16, DType::float32, value.size()));
  narrow_values(WireFormat::bf16, DType::float32, bytes_of(value), f.session->value);
  std::vector<float> out(6, -9);
  RowsRequest pull{.table = VariableId(6),
                   .step = Step(2),
                   .ids = ids,
                   .dim = 2,
                   .out = reinterpret_cast<std::byte*>(out.data()),
                   .rows_at = at,
                   .value_format = WireFormat::bf16};
  f.calls.pull_rows(pull).wait(f.scope);
  CHECK(f.session->calls.at(0).method == "pullRows");
  CHECK(f.session->calls[0].ids == ids);
  CHECK(f.session->calls[0].value_format == WireFormat::bf16);
  CHECK(out == std::vector<float>{0.25f, 3, -9, -9, 1.5f, -2});
  // An answer of the wrong size lands nothing.
  std::fill(out.begin(), out.end(), -9.f);
  f.session->value.resize(4);
  check_refused(f.calls.pull_rows(pull), f.scope, ErrorCode::shape_mismatch,
                "shard answered 4 bytes where 8 were expected");
  CHECK(out == std::vector<float>(6, -9));
}
