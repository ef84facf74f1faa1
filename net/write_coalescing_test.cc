// SPDX-License-Identifier: Apache-2.0
#include "net/write_coalescing.h"

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <capnp/rpc.capnp.h>
#include <capnp/serialize-async.h>
#include <capnp/serialize.h>
#include <doctest/doctest.h>
#include <kj/timer.h>

#include "net/forwarding_stream.h"

using namespace psched;

namespace {

// Records the bytes of each write that reaches it, then passes it on.
class RecordingStream final : public ForwardingStream {
 public:
  RecordingStream(kj::Own<kj::AsyncIoStream> inner, std::vector<std::string>& writes)
      : ForwardingStream(kj::mv(inner)), writes_(writes) {}
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    std::string bytes;
    for (auto piece : pieces) bytes.append(piece.asChars().begin(), piece.size());
    writes_.push_back(bytes);
    return ForwardingStream::write(pieces);
  }

 private:
  std::vector<std::string>& writes_;
};

// A coalescing stream (small messages: up to `small_bytes`; Finish messages held on `timer`
// when `hold_finishes`) over a pipe, recording each write that reaches the pipe.
struct RecordedPipe {
  explicit RecordedPipe(size_t small_bytes = 16, bool hold_finishes = false)
      : stream(with_write_coalescing(kj::heap<RecordingStream>(kj::mv(pipe.ends[0]), writes),
                                     small_bytes, hold_finishes ? &timer : nullptr)) {}

  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TimerImpl timer{kj::origin<kj::TimePoint>()};  // moves only when a test advances it
  kj::TwoWayPipe pipe = kj::newTwoWayPipe();
  std::vector<std::string> writes;
  kj::Own<WriteCoalescingStream> stream;
  // What the other end received once the stream shuts down.
  std::string received(kj::Promise<kj::String> reading) {
    stream->shutdownWrite();
    return std::string(reading.wait(scope).cStr());
  }
};

// A Cap'n Proto RPC Finish or Call of question `id`, written as the RPC system writes it.
struct RpcMessage {
  enum class Kind { finish, call };
  RpcMessage(Kind kind, uint32_t id) {
    auto root = builder.initRoot<capnp::rpc::Message>();
    if (kind == Kind::finish)
      root.initFinish().setQuestionId(id);
    else
      root.initCall().setQuestionId(id);
  }
  void write_to(RecordedPipe& p) { capnp::writeMessage(*p.stream, builder).wait(p.scope); }
  std::string bytes() {
    auto words = capnp::messageToFlatArray(builder);
    return std::string(words.asChars().begin(), words.asChars().size());
  }

  capnp::MallocMessageBuilder builder;
};

// `bytes` must outlive the promise, as a real writer's message does.
kj::Promise<void> write(kj::AsyncIoStream& stream, std::string_view bytes) {
  return stream.write(bytes.data(), bytes.size());
}

}  // namespace

TEST_CASE("small messages written in one turn leave in one write, in order") {
  RecordedPipe p;
  auto reading = p.pipe.ends[1]->readAllText();
  write(*p.stream, "call").wait(p.scope);  // accepted at once: copied
  write(*p.stream, "finish").wait(p.scope);
  CHECK(p.writes.empty());
  p.scope.poll();  // the loop is about to wait for I/O: the turn's messages leave
  CHECK(p.writes == std::vector<std::string>{"callfinish"});
  CHECK(p.received(kj::mv(reading)) == "callfinish");
}

TEST_CASE("shutting down sends what is buffered first") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto pipe = kj::newTwoWayPipe();
  auto stream = with_write_coalescing(kj::mv(pipe.ends[0]), 16);
  auto reading = pipe.ends[1]->readAllText();
  write(*stream, "abort").wait(scope);
  stream->shutdownWrite();
  CHECK(std::string(reading.wait(scope).cStr()) == "abort");
}

TEST_CASE("a large message carries the small ones before it in the same write") {
  RecordedPipe p;
  std::string large(40, 'v');
  auto call = write(*p.stream, large);  // large: handed on at once, in progress until read
  write(*p.stream, "finish").wait(p.scope);
  auto value = write(*p.stream, large);  // not copied: waits for "call"
  auto reading = p.pipe.ends[1]->readAllText();
  call.wait(p.scope);
  value.wait(p.scope);
  CHECK(p.received(kj::mv(reading)) == large + "finish" + large);
  CHECK(p.writes == std::vector<std::string>{large, "finish" + large});
}

TEST_CASE("whatever the sizes, the bytes arrive in the order written") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  std::mt19937 rng(11);
  auto pipe = kj::newTwoWayPipe();
  auto stream = with_write_coalescing(kj::mv(pipe.ends[0]), 64);
  auto reading = pipe.ends[1]->readAllText();
  std::string sent;
  for (int i = 0; i < 300; ++i) {
    std::string message(1 + rng() % 200, static_cast<char>('a' + i % 26));
    sent += message;
    write(*stream, message).wait(scope);
    if (rng() % 5 == 0) scope.poll();  // some turns end between writes
  }
  stream->shutdownWrite();
  CHECK(std::string(reading.wait(scope).cStr()) == sent);
}

TEST_CASE("a lone Finish waits for the next call to carry it") {
  RecordedPipe p(1024, true);
  RpcMessage finish(RpcMessage::Kind::finish, 7), call(RpcMessage::Kind::call, 8);
  finish.write_to(p);
  p.scope.poll();
  CHECK(p.writes.empty());  // the turn ended: a call or return would have left here
  call.write_to(p);
  p.scope.poll();
  CHECK(p.writes == std::vector<std::string>{finish.bytes() + call.bytes()});
}

TEST_CASE("a lone Finish leaves when the hold has passed without a write") {
  RecordedPipe p(1024, true);
  RpcMessage finish(RpcMessage::Kind::finish, 7), other(RpcMessage::Kind::finish, 9);
  finish.write_to(p);
  other.write_to(p);
  p.timer.advanceTo(p.timer.now() + kFinishHold - 1 * kj::MICROSECONDS);
  p.scope.poll();
  CHECK(p.writes.empty());
  p.timer.advanceTo(p.timer.now() + 1 * kj::MICROSECONDS);
  p.scope.poll();
  CHECK(p.writes == std::vector<std::string>{finish.bytes() + other.bytes()});
}

TEST_CASE("without a timer a Finish leaves at the end of its turn") {
  RecordedPipe p(1024);
  RpcMessage finish(RpcMessage::Kind::finish, 7);
  finish.write_to(p);
  p.scope.poll();
  CHECK(p.writes == std::vector<std::string>{finish.bytes()});
}

TEST_CASE("a small write that is no Cap'n Proto message is not held") {
  RecordedPipe p(1024, true);
  alignas(capnp::word) const kj::byte table[8] = {0, 0, 0, 0, 2, 0, 0, 0};
  alignas(capnp::word) const kj::byte garbage[16] = {
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};  // a far pointer to nowhere
  const kj::ArrayPtr<const kj::byte> pieces[] = {table, garbage};
  p.stream->write(pieces).wait(p.scope);
  p.scope.poll();
  REQUIRE(p.writes.size() == 1);
  CHECK(p.writes[0].size() == sizeof table + sizeof garbage);
}
