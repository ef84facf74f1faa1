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

// `bytes` must outlive the promise, as a real writer's message does.
kj::Promise<void> write(kj::AsyncIoStream& stream, std::string_view bytes) {
  return stream.write(bytes.data(), bytes.size());
}

}  // namespace

TEST_CASE("small messages written in one turn leave in one write, in order") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto pipe = kj::newTwoWayPipe();
  std::vector<std::string> writes;
  auto stream = with_write_coalescing(kj::heap<RecordingStream>(kj::mv(pipe.ends[0]), writes), 16);
  auto reading = pipe.ends[1]->readAllText();
  write(*stream, "call").wait(scope);  // accepted at once: copied
  write(*stream, "finish").wait(scope);
  CHECK(writes.empty());
  scope.poll();  // the loop is about to wait for I/O: the turn's messages leave
  CHECK(writes == std::vector<std::string>{"callfinish"});
  stream->shutdownWrite();
  CHECK(std::string(reading.wait(scope).cStr()) == "callfinish");
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
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto pipe = kj::newTwoWayPipe();
  std::vector<std::string> writes;
  auto stream = with_write_coalescing(kj::heap<RecordingStream>(kj::mv(pipe.ends[0]), writes), 16);
  std::string large(40, 'v');
  auto call = write(*stream, large);  // large: handed on at once, in progress until read
  write(*stream, "finish").wait(scope);
  auto value = write(*stream, large);  // not copied: waits for "call"
  auto reading = pipe.ends[1]->readAllText();
  call.wait(scope);
  value.wait(scope);
  stream->shutdownWrite();
  CHECK(std::string(reading.wait(scope).cStr()) == large + "finish" + large);
  CHECK(writes == std::vector<std::string>{large, "finish" + large});
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
