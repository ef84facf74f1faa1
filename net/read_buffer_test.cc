// SPDX-License-Identifier: Apache-2.0
#include "net/read_buffer.h"

#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("reads through the buffer return the bytes written, whatever the read sizes") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  std::mt19937 rng(7);
  std::vector<kj::byte> sent(20000);
  for (auto& b : sent) b = static_cast<kj::byte>(rng());
  for (size_t buffer : {1, 7, 64, 4096, 65536}) {
    auto pipe = kj::newTwoWayPipe();
    auto reader = with_read_buffer(kj::mv(pipe.ends[1]), buffer);
    auto writing = pipe.ends[0]->write(sent.data(), sent.size()).eagerlyEvaluate(nullptr);
    std::vector<kj::byte> got(sent.size());
    size_t at = 0;
    while (at < got.size()) {
      size_t max = std::min<size_t>(got.size() - at, 1 + rng() % 9000);
      size_t min = 1 + rng() % max;
      size_t n = reader->tryRead(got.data() + at, min, max).wait(scope);
      REQUIRE(n >= min);
      REQUIRE(n <= max);
      at += n;
    }
    writing.wait(scope);
    CHECK(got == sent);
  }
}

TEST_CASE("a read through the buffer ends short at the end of the stream") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto pipe = kj::newTwoWayPipe();
  auto reader = with_read_buffer(kj::mv(pipe.ends[1]), 16);
  kj::byte data[5] = {1, 2, 3, 4, 5};
  auto& writer = *pipe.ends[0];
  auto writing =
      writer.write(data, 5).then([&writer] { writer.shutdownWrite(); }).eagerlyEvaluate(nullptr);
  kj::byte got[8] = {};
  CHECK(reader->tryRead(got, 8, 8).wait(scope) == 5);
  CHECK(got[4] == 5);
  CHECK(reader->tryRead(got, 1, 8).wait(scope) == 0);
}
