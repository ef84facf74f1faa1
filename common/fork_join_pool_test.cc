// SPDX-License-Identifier: Apache-2.0
#include "common/fork_join_pool.h"

#include <atomic>
#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>

using psched::ForkJoinPool;

TEST_CASE("every piece runs exactly once before run returns") {
  ForkJoinPool pool(3);
  for (size_t pieces : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> runs(pieces);
    pool.run(pieces, [&](size_t i) { ++runs[i]; });
    for (auto& r : runs) CHECK(r == 1);
  }
}

TEST_CASE("a pool without helpers runs every piece on the caller") {
  ForkJoinPool pool(0);
  CHECK(pool.width() == 1);
  int sum = 0;  // no synchronisation needed: only the caller runs pieces
  pool.run(10, [&](size_t i) { sum += static_cast<int>(i); });
  CHECK(sum == 45);
}

TEST_CASE("the first exception of a piece reaches the caller after all pieces ran") {
  ForkJoinPool pool(2);
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.run(20,
                           [&](size_t i) {
                             ++ran;
                             if (i == 5) throw std::runtime_error("piece 5");
                           }),
                  std::runtime_error);
  CHECK(ran == 20);
}
