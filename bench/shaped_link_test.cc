// SPDX-License-Identifier: Apache-2.0
#include "bench/shaped_link.h"

#include <doctest/doctest.h>

using psched::bench::LinkShaper;

namespace {

// A manual clock: transfers resolve only when the test advances time.
struct ShaperFixture {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::TimerImpl timer{kj::origin<kj::TimePoint>()};
  LinkShaper link{timer, 1e6};  // 1 MB/s: 1000 bytes take 1 ms

  void advance_ms(int64_t ms) {
    timer.advanceTo(timer.now() + ms * kj::MILLISECONDS);
    scope.poll();
  }
};

}  // namespace

TEST_CASE("transfers queue back to back at the link rate") {
  ShaperFixture f;
  bool first = false, second = false;
  auto a = f.link.transfer(1000).then([&] { first = true; }).eagerlyEvaluate(nullptr);
  auto b = f.link.transfer(3000).then([&] { second = true; }).eagerlyEvaluate(nullptr);
  f.advance_ms(1);
  CHECK(first);
  CHECK_FALSE(second);
  f.advance_ms(2);
  CHECK_FALSE(second);
  f.advance_ms(1);
  CHECK(second);
  CHECK(f.link.busy_s() == doctest::Approx(0.004));
}

TEST_CASE("a gap shorter than the burst does not lower the rate") {
  ShaperFixture f;
  auto a = f.link.transfer(1000).eagerlyEvaluate(nullptr);
  f.advance_ms(2);  // done at 1 ms; the loop "woke late" at 2 ms, within the 2 ms burst
  bool done = false;
  auto b = f.link.transfer(1000).then([&] { done = true; }).eagerlyEvaluate(nullptr);
  CHECK(done == false);
  f.advance_ms(0);
  CHECK(done);  // scheduled from 1 ms, the link's free time, so it ends at 2 ms: now
}

TEST_CASE("after an idle gap longer than the burst a transfer starts from the burst edge") {
  ShaperFixture f;
  auto a = f.link.transfer(1000).eagerlyEvaluate(nullptr);
  f.advance_ms(11);  // idle from 1 ms to 11 ms
  bool done = false;
  auto b = f.link.transfer(4000).then([&] { done = true; }).eagerlyEvaluate(nullptr);
  f.advance_ms(1);  // 9 ms + 4 ms = 13 ms: not yet at 12 ms
  CHECK_FALSE(done);
  f.advance_ms(1);
  CHECK(done);
}
