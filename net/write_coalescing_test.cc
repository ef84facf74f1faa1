// SPDX-License-Identifier: Apache-2.0
#include "net/write_coalescing.h"

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

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

// A coalescing stream (small messages: up to 16 bytes) over a pipe, recording each write
// that reaches the pipe; `reading` collects what the other end receives.
struct RecordedPipe {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TwoWayPipe pipe = kj::newTwoWayPipe();
  std::vector<std::string> writes;
  kj::Own<WriteCoalescingStream> stream =
      with_write_coalescing(kj::heap<RecordingStream>(kj::mv(pipe.ends[0]), writes), 16);
  // What the other end received once the stream shuts down.
  std::string received(kj::Promise<kj::String> reading) {
    stream->shutdownWrite();
    return std::string(reading.wait(scope).cStr());
  }
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
