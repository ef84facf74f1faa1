// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/autotuner.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>

using namespace psched;

namespace {

constexpr uint64_t kKiB = 1 << 10, kMiB = 1 << 20;

// A bowl in log2 space with its minimum at `best`: what iteration time looks like against
// partition size (per-message cost vs preemption delay) and credit (idle link vs queueing).
struct Bowl {
  TuningPoint best;
  double floor = 1.0;
  double operator()(TuningPoint p) const {
    double dp = std::log2(double(p.partition_bytes) / double(best.partition_bytes));
    double dc = std::log2(double(p.credit_bytes) / double(best.credit_bytes));
    return floor * (1 + 0.05 * dp * dp + 0.03 * dc * dc);
  }
};

// Feeds `tuner` iterations timed by `cost` until it converges; returns the iterations it took.
int run_until_converged(Autotuner& tuner, const auto& cost, int limit = 1000) {
  for (int i = 1; i <= limit; ++i) {
    tuner.observe(cost(tuner.current()));
    if (tuner.converged()) return i;
  }
  FAIL("no convergence in ", limit, " iterations");
  return limit;
}

}  // namespace

TEST_CASE("the tuner walks the grid to the minimum of a synthetic cost and stays there") {
  Bowl bowl{{256 * kKiB, 2 * kMiB}};
  Autotuner tuner({1 * kMiB, 4 * kMiB});
  int iterations = run_until_converged(tuner, bowl);
  CHECK(tuner.current() == bowl.best);
  CHECK(tuner.tuned_seconds() == doctest::Approx(bowl.floor));
  CHECK(iterations < 100);
  for (int i = 0; i < 50; ++i) CHECK_FALSE(tuner.observe(bowl(tuner.current())));
  CHECK(tuner.searches() == 1);
}

TEST_CASE("every setting the tuner proposes is on the grid and within bounds") {
  AutotunerOptions options;
  options.max_credit_bytes = 8 * kMiB;
  Bowl bowl{{16 * kMiB, 64 * kMiB}};  // outside the bounds: the tuner stops at them
  Autotuner tuner({1 * kMiB, 4 * kMiB}, options);
  for (int i = 0; i < 300; ++i) {
    if (auto p = tuner.observe(bowl(tuner.current()))) {
      CHECK(p->partition_bytes >= options.min_partition_bytes);
      CHECK(p->partition_bytes <= options.max_partition_bytes);
      CHECK(p->credit_bytes >= p->partition_bytes);
      CHECK(p->credit_bytes <= options.max_credit_bytes);
      CHECK(std::has_single_bit(p->partition_bytes / (64 * kKiB)));
    }
  }
  CHECK(tuner.converged());
  CHECK(tuner.current() == TuningPoint{8 * kMiB, 8 * kMiB});
}

TEST_CASE("iterations right after a change are ignored") {
  AutotunerOptions options;
  options.settle_iterations = 2;
  options.measure_iterations = 1;
  Autotuner tuner({1 * kMiB, 4 * kMiB}, options);
  CHECK_FALSE(tuner.observe(100));  // settling: the first iterations carry no signal
  CHECK_FALSE(tuner.observe(100));
  auto next = tuner.observe(1.0);  // the center measured: on to the first neighbour
  REQUIRE(next);
  TuningPoint neighbour = *next;
  CHECK_FALSE(tuner.observe(1000));  // its first two iterations do not count
  CHECK_FALSE(tuner.observe(1000));
  CHECK(tuner.observe(2.0));
  CHECK(tuner.current() != neighbour);
}

TEST_CASE("a gain below min_gain does not move the tuner") {
  AutotunerOptions options;
  options.min_gain = 0.10;
  Bowl bowl{{512 * kKiB, 4 * kMiB}};  // one step away, 5% faster: not worth a move
  Autotuner tuner({1 * kMiB, 4 * kMiB}, options);
  run_until_converged(tuner, bowl);
  CHECK(tuner.current() == TuningPoint{1 * kMiB, 4 * kMiB});
}

TEST_CASE("a drift of the iteration time starts a new search that finds the new minimum") {
  Bowl before{{256 * kKiB, 2 * kMiB}};
  Autotuner tuner({1 * kMiB, 4 * kMiB});
  run_until_converged(tuner, before);
  REQUIRE(tuner.current() == before.best);

  Bowl after{{2 * kMiB, 16 * kMiB}, 1.5};  // say, the network got slower
  bool left = false;
  for (int i = 0; i < 400 && !(left && tuner.converged()); ++i) {
    tuner.observe(after(tuner.current()));
    left = left || !tuner.converged();
  }
  CHECK(left);
  CHECK(tuner.converged());
  CHECK(tuner.searches() == 2);
  CHECK(tuner.current() == after.best);
}

TEST_CASE("noise within the drift band does not start a search") {
  Bowl bowl{{1 * kMiB, 4 * kMiB}};
  Autotuner tuner({1 * kMiB, 4 * kMiB});
  run_until_converged(tuner, bowl);
  for (int i = 0; i < 200; ++i) tuner.observe(bowl.floor * (i % 2 ? 1.05 : 0.95));
  CHECK(tuner.searches() == 1);
  CHECK(tuner.converged());
}

TEST_CASE("the wide first step sees past a plateau that single steps would stop at") {
  // Flat down to 512 KiB, 20% faster from 256 KiB: one halving shows no gain, two do.
  auto plateau = [](TuningPoint p) { return p.partition_bytes <= 256 * kKiB ? 0.8 : 1.0; };
  Autotuner tuner({1 * kMiB, 4 * kMiB});
  run_until_converged(tuner, plateau);
  CHECK(tuner.current().partition_bytes <= 256 * kKiB);
  CHECK(tuner.tuned_seconds() == doctest::Approx(0.8));

  AutotunerOptions single;
  single.first_step = 2;
  Autotuner narrow({1 * kMiB, 4 * kMiB}, single);
  run_until_converged(narrow, plateau);
  CHECK(narrow.current() == TuningPoint{1 * kMiB, 4 * kMiB});  // what the wide step is for
}

TEST_CASE("a valley along the diagonal is followed by moving both sizes together") {
  // Fast only where credit is 4 partitions and both are small: moving one size alone is worse.
  auto valley = [](TuningPoint p) {
    double ratio = std::log2(double(p.credit_bytes) / double(p.partition_bytes)) - 2;
    double size = std::log2(double(p.partition_bytes) / double(256 * kKiB));
    return 1.0 + 0.3 * ratio * ratio + 0.05 * size * size;
  };
  Autotuner tuner({1 * kMiB, 4 * kMiB});
  run_until_converged(tuner, valley);
  CHECK(tuner.current() == TuningPoint{256 * kKiB, 1 * kMiB});
}
