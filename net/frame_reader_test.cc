// SPDX-License-Identifier: Apache-2.0
#include "net/frame_reader.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

namespace {

struct ReaderFixture {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TwoWayPipe pipe = kj::newTwoWayPipe();
  FrameReader reader{*pipe.ends[0], false};

  static std::string frame(uint64_t id, const std::string& body) {
    FrameHeaderBytes h = encode(AnswerHeader{wire::AnswerKind::VALUE, id, 0, 0, body.size()});
    return std::string(reinterpret_cast<const char*>(h.data()), h.size()) + body;
  }
  void send(const std::string& bytes) {
    pipe.ends[1]->write(bytes.data(), bytes.size()).wait(scope);
  }
  // Serves each frame by reading its body into `bodies`, at once when buffered.
  FrameReader::Serve collect(std::vector<std::string>& bodies) {
    return [this, &bodies](const FrameHeaderBytes& bytes) -> kj::Maybe<kj::Promise<void>> {
      std::optional<AnswerHeader> answer = decode_answer(bytes);
      REQUIRE(answer);
      bodies.emplace_back(answer->body_bytes, '\0');
      return reader.body().read_or_wait(bodies.back().data(), answer->body_bytes);
    };
  }
};

}  // namespace

TEST_CASE("frames are served in order, whatever pieces they arrive in") {
  std::string stream = ReaderFixture::frame(1, "first") + ReaderFixture::frame(2, "") +
                       ReaderFixture::frame(3, std::string(200 * 1024, 'b'));
  for (size_t piece : {size_t{1}, size_t{7}, kFrameHeaderBytes, size_t{4096}, stream.size()}) {
    CAPTURE(piece);
    ReaderFixture f;
    std::vector<std::string> bodies;
    bodies.reserve(3);  // read_or_wait writes into them while they wait
    auto served = f.reader.run(f.collect(bodies));
    for (size_t at = 0; at < stream.size(); at += piece) f.send(stream.substr(at, piece));
    f.pipe.ends[1]->shutdownWrite();
    served.wait(f.scope);
    REQUIRE(bodies.size() == 3);
    CHECK(bodies[0] == "first");
    CHECK(bodies[1].empty());
    CHECK(bodies[2] == std::string(200 * 1024, 'b'));
  }
}

TEST_CASE("a stream that ends inside a frame is lost; one that ends between frames is done") {
  ReaderFixture f;
  std::vector<std::string> bodies;
  bodies.reserve(2);
  auto served = f.reader.run(f.collect(bodies));
  std::string frame = ReaderFixture::frame(1, "body");
  f.send(frame + frame.substr(0, 10));
  f.pipe.ends[1]->shutdownWrite();
  try {
    served.wait(f.scope);
    FAIL("the cut frame was not noticed");
  } catch (const kj::Exception& e) {
    CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
  }
  CHECK(bodies.size() == 1);
}

TEST_CASE("no frame is read while the owner has no room") {
  ReaderFixture f;
  std::vector<std::string> bodies;
  bodies.reserve(2);
  auto room = kj::newPromiseAndFulfiller<void>();
  bool full = true;
  auto served = f.reader.run(f.collect(bodies), [&]() -> kj::Maybe<kj::Promise<void>> {
    if (!full) return nullptr;
    full = false;
    return kj::mv(room.promise);
  });
  std::string frames = ReaderFixture::frame(1, "a") + ReaderFixture::frame(2, "b");
  auto sending = f.pipe.ends[1]->write(frames.data(), frames.size());  // read once there is room
  f.scope.poll();
  CHECK(bodies.empty());
  room.fulfiller->fulfill();
  f.scope.poll();
  CHECK(bodies.size() == 2);
  sending.wait(f.scope);
  f.pipe.ends[1]->shutdownWrite();
  served.wait(f.scope);
}

TEST_CASE(
    "a peer silent inside a frame is dropped after the timeout; one silent between "
    "frames is not") {
  ReaderFixture f;
  kj::TimerImpl timer(kj::origin<kj::TimePoint>());
  std::vector<std::string> bodies;
  bodies.reserve(1);
  auto served = f.reader.run(f.collect(bodies));
  auto stalled = f.reader.stalls(timer, 8 * kj::SECONDS, "limits.stall_timeout_seconds").fork();
  auto wait_seconds = [&](int seconds) {
    for (int i = 0; i < seconds; ++i) {
      timer.advanceTo(timer.now() + kj::SECONDS);
      f.scope.poll();
    }
  };
  wait_seconds(30);  // between frames: as long as it likes
  CHECK_FALSE(stalled.addBranch().poll(f.scope));
  f.send(ReaderFixture::frame(1, "abc").substr(0, 12));
  wait_seconds(7);
  CHECK_FALSE(stalled.addBranch().poll(f.scope));
  wait_seconds(4);
  auto ended = stalled.addBranch();
  REQUIRE(ended.poll(f.scope));
  try {
    ended.wait(f.scope);
    FAIL("the stall was not noticed");
  } catch (const kj::Exception& e) {
    CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
    CHECK(std::string(e.getDescription().cStr()).find("limits.stall_timeout_seconds") !=
          std::string::npos);
  }
}
