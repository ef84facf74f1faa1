// SPDX-License-Identifier: Apache-2.0
// order_by_id against std::stable_sort by id, over the sizes either side of its switch to a
// radix sort and ids of every width, with many duplicates and with none.
#include "actors/shard/row_order.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

namespace {

std::vector<uint32_t> stable_sorted(const std::vector<uint64_t>& ids) {
  std::vector<uint32_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
  return order;
}

// `n` ids drawn from [0, range) (range 0: every 64-bit value), seeded by `seed`.
std::vector<uint64_t> random_ids(size_t n, uint64_t range, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<uint64_t> ids(n);
  for (uint64_t& id : ids) id = range ? random() % range : random();
  return ids;
}

}  // namespace

TEST_CASE("ids are ordered as a stable sort orders them, duplicates in the order given") {
  for (size_t n : {0, 1, 2, 255, 256, 257, 1000, 4096, 20000}) {
    for (uint64_t range : {uint64_t{1}, uint64_t{3}, uint64_t{1} << 11, uint64_t{1000003},
                           uint64_t{1} << 33, uint64_t{0}}) {
      CAPTURE(n);
      CAPTURE(range);
      const std::vector<uint64_t> ids = random_ids(n, range, n * 31 + range);
      CHECK(order_by_id(ids) == stable_sorted(ids));
    }
  }
}

TEST_CASE("ids already in order, in reverse and all one keep a stable sort's order") {
  std::vector<uint64_t> ids(5000);
  std::iota(ids.begin(), ids.end(), uint64_t{1} << 40);
  CHECK(order_by_id(ids) == stable_sorted(ids));
  std::reverse(ids.begin(), ids.end());
  CHECK(order_by_id(ids) == stable_sorted(ids));
  std::fill(ids.begin(), ids.end(), UINT64_MAX);
  CHECK(order_by_id(ids) == stable_sorted(ids));
}
