// SPDX-License-Identifier: Apache-2.0
// DataChannel against a shard side written by hand: the other end of an in-memory pipe, which
// reads the worker's request frames and writes answer frames with net/data_frame.h, so each
// test says exactly what went over the stream each way. One thread, one KJ event loop.
#include "link/data_channel.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/kj_error.h"
#include "compression/codec.h"
#include "link/data_path_test_support.h"
#include "net/data_frame.h"

using namespace psched;
using psched::testing::check_refused;

namespace {

constexpr uint64_t kMaxAnswerBytes = 1 << 20;

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

// A channel opened over a pipe whose other end the test plays the shard on.
struct ChannelFixture {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::Own<kj::AsyncIoStream> shard;  // the shard's end of the stream
  kj::Own<DataChannel> channel;
  const std::array<kj::byte, kDataKeyBytes> key = {7, 1, 2,  3,  4,  5,  6,  7,
                                                   8, 9, 10, 11, 12, 13, 14, 15};

  ChannelFixture() {
    auto pipe = kj::newTwoWayPipe();
    shard = kj::mv(pipe.ends[1]);
    auto opening =
        DataChannel::open(kj::mv(pipe.ends[0]), {key.data(), key.size()}, kMaxAnswerBytes);
    std::vector<std::byte> preface = read(kDataPreface.size() + kDataKeyBytes);
    CHECK(std::memcmp(preface.data(), kDataPreface.data(), kDataPreface.size()) == 0);
    CHECK(std::memcmp(preface.data() + kDataPreface.size(), key.data(), key.size()) == 0);
    answer({.kind = wire::AnswerKind::READY});
    channel = opening.wait(scope);
  }

  // The shard reads `n` bytes of the stream.
  std::vector<std::byte> read(size_t n) {
    std::vector<std::byte> out(n);
    shard->read(out.data(), n).wait(scope);
    return out;
  }
  // The shard reads the next request frame's header.
  RequestHeader read_request() {
    FrameHeaderBytes bytes;
    shard->read(bytes.data(), bytes.size()).wait(scope);
    std::string why;
    std::optional<RequestHeader> request = decode_request(bytes, why);
    REQUIRE_MESSAGE(request, why);
    return *request;
  }
  // The shard writes an answer frame: `header` (its body_bytes set here) and `body`.
  void answer(AnswerHeader header, std::span<const std::byte> body = {}) {
    header.body_bytes = body.size();
    FrameHeaderBytes bytes = encode(header);
    std::vector<std::byte> frame(bytes.begin(), bytes.end());
    frame.insert(frame.end(), body.begin(), body.end());
    shard->write(frame.data(), frame.size()).wait(scope);
  }

  // A request for elements [0, out.size()) of variable 3 at step 1; its value lands in `out`.
  static PartitionRequest request(std::span<const std::byte> gradient, std::vector<float>& out) {
    return testing::request_of(gradient, out, Step(1), 0);
  }
};

}  // namespace

TEST_CASE("a push goes as one frame with its gradient and resolves at its receipt") {
  ChannelFixture f;
  std::vector<float> grad{1.f, 2.f, 3.f, 4.f}, out(4);
  auto pushed = f.channel->push(ChannelFixture::request(bytes_of(grad), out));
  RequestHeader request = f.read_request();
  CHECK(request.kind == wire::RequestKind::PUSH);
  CHECK(request.dtype == DType::float32);
  CHECK(request.variable == 3);
  CHECK(request.step == 1);
  CHECK(request.offset == 0);
  CHECK(request.body_bytes == 16);
  CHECK(request.format == WireFormat::none);
  std::vector<std::byte> body = f.read(request.body_bytes);
  CHECK(std::memcmp(body.data(), grad.data(), body.size()) == 0);
  CHECK_FALSE(pushed.poll(f.scope));  // not before the receipt
  f.answer({.kind = wire::AnswerKind::RECEIPT, .id = request.id});
  pushed.wait(f.scope);
  CHECK(out == std::vector<float>(4, 0.f));  // a push lands nothing
}

TEST_CASE("a poll's value lands in place, widened when it travels narrow") {
  ChannelFixture f;
  std::vector<float> out(4), value{1.5f, -2.f, 0.25f, 3.f};  // exact in bf16
  PartitionRequest part = ChannelFixture::request({}, out);
  std::vector<std::byte> body(bytes_of(value).begin(), bytes_of(value).end());
  SUBCASE("as float32") {}
  SUBCASE("as bf16") {
    part.value_format = WireFormat::bf16;
    body.resize(encoded_bytes(WireFormat::bf16, DType::float32, value.size()));
    narrow_values(WireFormat::bf16, DType::float32, bytes_of(value), body);
  }
  CAPTURE(to_string(part.value_format));
  auto polled = f.channel->poll(part);
  RequestHeader request = f.read_request();
  CHECK(request.kind == wire::RequestKind::POLL);
  CHECK(request.variable == 3);
  CHECK(request.step == 1);
  CHECK(request.offset == 0);
  CHECK(request.count == 4);
  CHECK(request.body_bytes == 0);
  CHECK(request.value_format == part.value_format);
  f.answer({.kind = wire::AnswerKind::VALUE,
            .id = request.id,
            .applied_step = 1,
            .applied_at_ns = 1234567,
            .format = part.value_format},
           body);
  Landed landed = polled.wait(f.scope);
  CHECK(landed.applied_at_ns == 1234567);
  CHECK(out == value);
}

TEST_CASE("a delta poll says the version it holds; a delta writes its elements, full values all") {
  ChannelFixture f;
  std::vector<float> out{1, 2, 3, 4};
  uint64_t version = 41;
  PartitionRequest part = ChannelFixture::request({}, out);
  part.delta = {.version = &version, .count = 2, .ring = 3};
  auto polled = f.channel->poll(part);
  RequestHeader request = f.read_request();
  CHECK(request.base_version == 41);
  CHECK(request.delta_count == 2);
  CHECK(request.delta_ring == 3);
  std::vector<float> published{1, 2, 3, 4}, current{1, 9, 3, 8};
  std::vector<std::byte> body;
  std::vector<uint32_t> sent;
  encode_delta(DType::float32, bytes_of(current), std::as_writable_bytes(std::span(published)), 2,
               body, sent);
  f.answer({.kind = wire::AnswerKind::VALUE,
            .id = request.id,
            .body_bytes = body.size(),
            .format = WireFormat::topk,
            .version = 42},
           body);
  polled.wait(f.scope);
  CHECK(out == current);
  CHECK(version == 42);
  // A refresh says so, with its version; full values land whole.
  part.delta.refresh = true;
  auto refreshed = f.channel->poll(part);
  request = f.read_request();
  CHECK(request.base_version == 42);
  CHECK(request.delta_refresh);
  std::vector<float> full{5, 6, 7, 8};
  f.answer({.kind = wire::AnswerKind::VALUE, .id = request.id, .version = 50}, bytes_of(full));
  refreshed.wait(f.scope);
  CHECK(out == full);
  CHECK(version == 50);
  // A delta where none was asked for is refused and lands nothing.
  part.delta = {};
  auto plain = f.channel->poll(part);
  request = f.read_request();
  CHECK(request.delta_count == 0);
  f.answer({.kind = wire::AnswerKind::VALUE,
            .id = request.id,
            .body_bytes = body.size(),
            .format = WireFormat::topk},
           body);
  check_refused(kj::mv(plain), f.scope, ErrorCode::invalid_argument,
                "shard answered in topk where none was asked for");
  CHECK(out == full);
  // A delta larger than one of every element is refused before its body is read.
  part.delta = {.version = &version, .count = 2, .ring = 3};
  auto oversized = f.channel->poll(part);
  request = f.read_request();
  std::vector<std::byte> huge(8 + 5 * 8);
  f.answer({.kind = wire::AnswerKind::VALUE,
            .id = request.id,
            .body_bytes = huge.size(),
            .format = WireFormat::topk},
           huge);
  check_refused(kj::mv(oversized), f.scope, ErrorCode::shape_mismatch,
                "shard answered 48 bytes where 40 were expected");
  CHECK(out == full);
  CHECK(version == 50);
}

TEST_CASE("a value of the wrong size is refused as a shape mismatch and lands nothing") {
  ChannelFixture f;
  std::vector<float> out(4), three{1.f, 2.f, 3.f};
  auto polled = f.channel->poll(ChannelFixture::request({}, out));
  RequestHeader request = f.read_request();
  f.answer({.kind = wire::AnswerKind::VALUE, .id = request.id}, bytes_of(three));
  check_refused(kj::mv(polled), f.scope, ErrorCode::shape_mismatch,
                "shard answered 12 bytes where 16 were expected");
  CHECK(out == std::vector<float>(4, 0.f));
}

TEST_CASE("an error frame rejects its request with the shard's code and message") {
  ChannelFixture f;
  std::vector<float> grad(4, 1.f), out(4);
  auto answered = f.channel->push_poll(ChannelFixture::request(bytes_of(grad), out));
  RequestHeader request = f.read_request();
  CHECK(request.kind == wire::RequestKind::PUSH_POLL);
  f.read(request.body_bytes);
  const std::string text = describe(
      Error(ErrorCode::step_from_future, "push to variable 'w' rejected: step 3 from the future"));
  f.answer({.kind = wire::AnswerKind::ERROR, .id = request.id},
           std::as_bytes(std::span(text.data(), text.size())));
  check_refused(kj::mv(answered), f.scope, ErrorCode::step_from_future,
                "push to variable 'w' rejected: step 3 from the future");
  CHECK(out == std::vector<float>(4, 0.f));
}

TEST_CASE("a dropped poll sends a cancel frame; its late value is skipped and the stream goes on") {
  ChannelFixture f;
  std::vector<float> out(4), value(4, 9.f), grad(4, 1.f);
  auto polled = f.channel->poll(ChannelFixture::request({}, out));
  RequestHeader poll = f.read_request();
  polled = nullptr;  // the caller gave up on it
  RequestHeader cancel = f.read_request();
  CHECK(cancel.kind == wire::RequestKind::CANCEL);
  CHECK(cancel.id == poll.id);
  // The shard answered before it read the cancel: the value is read past, not landed.
  f.answer({.kind = wire::AnswerKind::VALUE, .id = poll.id}, bytes_of(value));
  auto pushed = f.channel->push(ChannelFixture::request(bytes_of(grad), out));
  RequestHeader push = f.read_request();
  CHECK(push.kind == wire::RequestKind::PUSH);
  CHECK(push.id != poll.id);
  f.read(push.body_bytes);
  f.answer({.kind = wire::AnswerKind::RECEIPT, .id = push.id});
  pushed.wait(f.scope);
  CHECK(out == std::vector<float>(4, 0.f));
}

TEST_CASE("a lost stream fails every request waiting, and every later one, [disconnected]") {
  ChannelFixture f;
  std::vector<float> grad(4, 1.f), out(4), other(4);
  auto polled = f.channel->poll(ChannelFixture::request({}, out));
  auto answered = f.channel->push_poll(ChannelFixture::request(bytes_of(grad), other));
  CHECK(f.read_request().kind == wire::RequestKind::POLL);
  RequestHeader push_poll = f.read_request();
  f.read(push_poll.body_bytes);
  f.shard = nullptr;  // the shard's end goes away between frames
  const std::string lost = "data stream to the shard lost: the shard closed it";
  check_refused(kj::mv(polled), f.scope, ErrorCode::disconnected, lost);
  check_refused(kj::mv(answered), f.scope, ErrorCode::disconnected, lost);
  check_refused(f.channel->push(ChannelFixture::request(bytes_of(grad), out)), f.scope,
                ErrorCode::disconnected, lost);
}

namespace {

// Rows of table 9 at step 2: `ids` with rows of two floats; a pull's land at `at` of `out`.
RowsRequest rows_request(const std::vector<uint64_t>& ids, bool push) {
  return {.table = VariableId(9), .step = Step(2), .ids = ids, .dim = 2, .push = push};
}

}  // namespace

TEST_CASE("a push of rows goes as one frame, its ids then its rows, and resolves at its receipt") {
  ChannelFixture f;
  const std::vector<uint64_t> ids{12, 5};
  const std::vector<float> rows{1, 2, 3, 4};
  RowsRequest push = rows_request(ids, true);
  push.gradient = bytes_of(rows);
  auto pushed = f.channel->push_rows(push);
  RequestHeader request = f.read_request();
  CHECK(request.kind == wire::RequestKind::PUSH_ROWS);
  CHECK(request.variable == 9);
  CHECK(request.step == 2);
  CHECK(request.offset == 2);  // how many ids start the body
  CHECK(request.body_bytes == 2 * 8 + 16);
  std::vector<std::byte> body = f.read(request.body_bytes);
  CHECK(std::memcmp(body.data(), ids.data(), 16) == 0);
  CHECK(std::memcmp(body.data() + 16, rows.data(), 16) == 0);
  CHECK_FALSE(pushed.poll(f.scope));
  f.answer({.kind = wire::AnswerKind::RECEIPT, .id = request.id});
  pushed.wait(f.scope);
}

TEST_CASE("a pull's rows land each where its place says, at full width and widened") {
  ChannelFixture f;
  const std::vector<uint64_t> ids{40, 7, 19};
  const std::vector<uint32_t> at{3, 0, 1};                    // the caller's rows for these ids
  const std::vector<float> value{1.5f, -2, 0.25f, 3, -1, 8};  // exact in bf16
  std::vector<float> out(8, -9);
  RowsRequest pull = rows_request(ids, false);
  pull.out = reinterpret_cast<std::byte*>(out.data());
  pull.rows_at = at;
  std::vector<std::byte> body(bytes_of(value).begin(), bytes_of(value).end());
  SUBCASE("as float32, read straight into place") {}
  SUBCASE("as bf16") {
    pull.value_format = WireFormat::bf16;
    body.resize(encoded_bytes(WireFormat::bf16, DType::float32, value.size()));
    narrow_values(WireFormat::bf16, DType::float32, bytes_of(value), body);
  }
  CAPTURE(to_string(pull.value_format));
  auto pulled = f.channel->pull_rows(pull);
  RequestHeader request = f.read_request();
  CHECK(request.kind == wire::RequestKind::PULL_ROWS);
  CHECK(request.offset == 3);
  CHECK(request.value_format == pull.value_format);
  std::vector<std::byte> sent_ids = f.read(request.body_bytes);
  CHECK(std::memcmp(sent_ids.data(), ids.data(), 24) == 0);
  f.answer({.kind = wire::AnswerKind::VALUE,
            .id = request.id,
            .applied_step = 2,
            .format = pull.value_format},
           body);
  pulled.wait(f.scope);
  CHECK(out == std::vector<float>{0.25f, 3, -1, 8, -9, -9, 1.5f, -2});
}

TEST_CASE("a pull's rows answered one row short land nothing and fail as a shape mismatch") {
  ChannelFixture f;
  const std::vector<uint64_t> ids{1, 2};
  const std::vector<uint32_t> at{1, 0};
  std::vector<float> out(4, -9);
  RowsRequest pull = rows_request(ids, false);
  pull.out = reinterpret_cast<std::byte*>(out.data());
  pull.rows_at = at;
  auto pulled = f.channel->pull_rows(pull);
  RequestHeader request = f.read_request();
  f.read(request.body_bytes);
  const std::vector<float> short_value{1, 2};
  f.answer({.kind = wire::AnswerKind::VALUE, .id = request.id}, bytes_of(short_value));
  check_refused(kj::mv(pulled), f.scope, ErrorCode::shape_mismatch,
                "shard answered 8 bytes where 16 were expected");
  CHECK(out == std::vector<float>(4, -9));
}
