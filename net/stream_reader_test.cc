// SPDX-License-Identifier: Apache-2.0
#include "net/stream_reader.h"

#include <algorithm>
#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

namespace {

std::vector<kj::byte> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<kj::byte> bytes(n);
  for (auto& b : bytes) b = static_cast<kj::byte>(rng());
  return bytes;
}

}  // namespace

TEST_CASE("reads, fills, takes and skips return the bytes written, in order") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  std::mt19937 rng(11);
  std::vector<kj::byte> sent = random_bytes(200000, rng);
  for (size_t buffer : {1, 40, 4096, 65536}) {
    auto pipe = kj::newTwoWayPipe();
    StreamReader reader(*pipe.ends[1], buffer);
    auto writing = pipe.ends[0]->write(sent.data(), sent.size()).eagerlyEvaluate(nullptr);
    std::vector<kj::byte> got(sent.size());
    size_t at = 0;
    while (at < got.size()) {
      size_t n = std::min<size_t>(got.size() - at, 1 + rng() % 20000);
      switch (rng() % 3) {
        case 0:  // a read, straight into place when large
          reader.read(got.data() + at, n).wait(scope);
          break;
        case 1:  // a fill, then a take of what is buffered
          n = std::min(n, buffer);
          REQUIRE(reader.fill(n).wait(scope));
          REQUIRE(reader.buffered() >= n);
          reader.take(got.data() + at, n);
          break;
        default:  // a skip: those bytes stay as sent
          reader.skip(n).wait(scope);
          std::copy_n(sent.begin() + at, n, got.begin() + at);
      }
      at += n;
    }
    writing.wait(scope);
    CHECK(got == sent);
    CHECK(reader.received() == sent.size());
    CHECK(reader.buffered() == 0);
  }
}

TEST_CASE("a fill reports the end of the stream and keeps what came before it") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto pipe = kj::newTwoWayPipe();
  StreamReader reader(*pipe.ends[1], 64);
  kj::byte data[5] = {1, 2, 3, 4, 5};
  auto& writer = *pipe.ends[0];
  auto writing =
      writer.write(data, 5).then([&writer] { writer.shutdownWrite(); }).eagerlyEvaluate(nullptr);
  CHECK_FALSE(reader.fill(8).wait(scope));
  CHECK(reader.buffered() == 5);
  kj::byte got[8] = {};
  CHECK_THROWS(reader.read(got, 8).wait(scope));
  writing.wait(scope);
}

TEST_CASE("a large read lands straight in place, its progress counted every MiB or so") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  std::mt19937 rng(3);
  std::vector<kj::byte> sent = random_bytes(3 << 20, rng);
  auto pipe = kj::newTwoWayPipe();
  StreamReader reader(*pipe.ends[1], 64);
  std::vector<kj::byte> got(sent.size());
  auto reading = reader.read(got.data(), got.size()).eagerlyEvaluate(nullptr);
  pipe.ends[0]->write(sent.data(), 1000).wait(scope);
  scope.poll();
  CHECK(reader.received() == 0);  // under a MiB: no progress yet
  pipe.ends[0]->write(sent.data() + 1000, (3 << 19) - 1000).wait(scope);
  scope.poll();
  CHECK(reader.received() == 3 << 19);  // progress shows before the read completes
  CHECK_FALSE(reading.poll(scope));
  pipe.ends[0]->write(sent.data() + (3 << 19), sent.size() - (3 << 19)).wait(scope);
  reading.wait(scope);
  CHECK(got == sent);
  CHECK(reader.received() == sent.size());
}

TEST_CASE("read_or_wait hands buffered bytes over at once, and waits only for missing ones") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  std::mt19937 rng(5);
  std::vector<kj::byte> sent = random_bytes(100, rng);
  auto pipe = kj::newTwoWayPipe();
  StreamReader reader(*pipe.ends[1], 64);
  auto writing = pipe.ends[0]->write(sent.data(), 60).eagerlyEvaluate(nullptr);
  REQUIRE(reader.fill(60).wait(scope));
  std::vector<kj::byte> got(sent.size());
  CHECK(reader.read_or_wait(got.data(), 50) == nullptr);  // buffered: in place on return
  CHECK(std::equal(got.begin(), got.begin() + 50, sent.begin()));
  auto rest = reader.read_or_wait(got.data() + 50, 50);  // 10 buffered, 40 still to come
  KJ_IF_MAYBE (reading, rest) {
    CHECK_FALSE(reading->poll(scope));
    pipe.ends[0]->write(sent.data() + 60, 40).wait(scope);
    reading->wait(scope);
  } else {
    FAIL("read_or_wait returned null with bytes missing");
  }
  CHECK(got == sent);
  writing.wait(scope);
}
