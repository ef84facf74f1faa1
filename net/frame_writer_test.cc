// SPDX-License-Identifier: Apache-2.0
#include "net/frame_writer.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "net/forwarding_stream.h"

using namespace psched;

namespace {

// Records each write that reaches it: its bytes and how many pieces it came in.
class RecordingStream final : public ForwardingStream {
 public:
  struct Write {
    std::string bytes;
    size_t pieces;
  };
  RecordingStream(kj::Own<kj::AsyncIoStream> inner, std::vector<Write>& writes)
      : ForwardingStream(kj::mv(inner)), writes_(writes) {}
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    std::string bytes;
    for (auto piece : pieces) bytes.append(piece.asChars().begin(), piece.size());
    writes_.push_back({bytes, pieces.size()});
    return ForwardingStream::write(pieces);
  }

 private:
  std::vector<Write>& writes_;
};

struct WriterFixture {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TwoWayPipe pipe = kj::newTwoWayPipe();
  std::vector<RecordingStream::Write> writes;
  RecordingStream stream{kj::mv(pipe.ends[0]), writes};
  std::vector<std::string> failures;
  FrameWriter writer{stream,
                     [this](kj::Exception e) { failures.push_back(e.getDescription().cStr()); }};

  static FrameHeaderBytes header(uint64_t id, uint64_t body_bytes) {
    return encode(AnswerHeader{wire::AnswerKind::VALUE, id, 0, 0, body_bytes});
  }
  static std::string as_text(const FrameHeaderBytes& h) {
    return std::string(reinterpret_cast<const char*>(h.data()), h.size());
  }
  // Starts reading `bytes` bytes from the pipe's other end (an in-memory pipe's write waits
  // for them to be read); they are in `received` once the promise resolves.
  kj::Promise<void> read(size_t bytes) {
    received.assign(bytes, '\0');
    return pipe.ends[1]->read(received.data(), bytes);
  }
  std::string received;
};

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("frames added in one turn and flushed at its end share one write, in order") {
  WriterFixture f;
  std::string small(100, 's'), large(FrameWriter::kCopiedBodyBytes, 'L');
  f.writer.add(f.header(1, small.size()), bytes_of(small));
  f.writer.add(f.header(2, large.size()), bytes_of(large));
  f.writer.add(f.header(3, 0));
  f.writer.flush_at_end_of_turn();
  CHECK(f.writes.empty());  // not before the turn ends
  CHECK(f.writer.waiting_bytes() == 3 * kFrameHeaderBytes + small.size() + large.size());
  auto reading = f.read(3 * kFrameHeaderBytes + small.size() + large.size());
  f.writer.drained().wait(f.scope);
  reading.wait(f.scope);
  REQUIRE(f.writes.size() == 1);
  // The small body is copied with the headers; the large one is a piece of its own.
  CHECK(f.writes[0].pieces == 3);
  std::string expected = f.as_text(f.header(1, small.size())) + small +
                         f.as_text(f.header(2, large.size())) + large + f.as_text(f.header(3, 0));
  CHECK(f.writes[0].bytes == expected);
  CHECK(f.writer.waiting_bytes() == 0);
  CHECK(f.received == expected);
}

TEST_CASE("what is added while a write is in flight goes in the next, once it is done") {
  WriterFixture f;
  std::string body(8, 'x');
  size_t written_calls = 0;
  f.writer.on_written([&] { ++written_calls; });
  f.writer.add(f.header(1, body.size()), bytes_of(body));
  f.writer.flush_now();
  CHECK(f.writer.writing());  // the pipe holds it until the other end reads
  f.writer.add(f.header(2, body.size()), bytes_of(body));
  f.writer.add(f.header(3, body.size()), bytes_of(body));
  f.writer.flush_now();
  size_t frame = kFrameHeaderBytes + body.size();
  auto reading = f.read(3 * frame);
  f.writer.drained().wait(f.scope);
  reading.wait(f.scope);
  REQUIRE(f.writes.size() == 2);
  CHECK(f.writes[0].bytes.size() == frame);
  CHECK(f.writes[1].bytes.size() == 2 * frame);
  CHECK(written_calls == 2);
  CHECK_FALSE(f.writer.writing());
}

TEST_CASE("a body copied on request is free at once, whatever its size") {
  WriterFixture f;
  std::string body(FrameWriter::kCopiedBodyBytes + 1, 'c');
  f.writer.add_copied(f.header(1, body.size()), bytes_of(body));
  body.assign(body.size(), 'X');  // the caller reuses its memory before the write
  f.writer.flush_now();
  auto reading = f.read(kFrameHeaderBytes + body.size());
  f.writer.drained().wait(f.scope);
  reading.wait(f.scope);
  REQUIRE(f.writes.size() == 1);
  CHECK(f.writes[0].pieces == 1);
  CHECK(f.writes[0].bytes.substr(kFrameHeaderBytes) == std::string(body.size(), 'c'));
}

TEST_CASE("a failed write is reported once, and nothing is written after it") {
  WriterFixture f;
  f.pipe.ends[1] = nullptr;  // the peer is gone
  f.writer.add(f.header(1, 0));
  f.writer.flush_now();
  f.scope.poll();
  REQUIRE(f.failures.size() == 1);
  f.writer.add(f.header(2, 0));
  f.writer.flush_now();
  f.scope.poll();
  CHECK(f.failures.size() == 1);
  CHECK(f.writes.size() == 1);
}
