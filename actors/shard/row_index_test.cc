// SPDX-License-Identifier: Apache-2.0
// RowIndex against std::unordered_map as the model: inserts, lookups, erases of ids held and not
// held, growth across many doublings, ids that share their home entry, and its byte counts.
#include "actors/shard/row_index.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

namespace {

// Every id of `model` found in `index` with its slot, and the sizes equal.
void check_same(const RowIndex& index, const std::unordered_map<uint64_t, uint32_t>& model) {
  REQUIRE(index.size() == model.size());
  for (const auto& [id, slot] : model) REQUIRE(index.find(id) == slot);
}

}  // namespace

TEST_CASE("an empty index finds nothing and holds no memory") {
  RowIndex index;
  CHECK(index.size() == 0);
  CHECK(index.capacity() == 0);
  CHECK(index.bytes_held() == 0);
  for (uint64_t id : {uint64_t{0}, uint64_t{1}, UINT64_MAX}) {
    CHECK(index.find(id) == RowIndex::kNone);
    CHECK_FALSE(index.contains(id));
    CHECK_FALSE(index.erase(id));
    index.prefetch(id);
  }
}

TEST_CASE("ids inserted are found with their slots, others are not") {
  RowIndex index;
  index.insert(0, 7);
  index.insert(UINT64_MAX, 0);
  index.insert(42, RowIndex::kNone - 1);
  CHECK(index.size() == 3);
  CHECK(index.find(0) == 7);
  CHECK(index.find(UINT64_MAX) == 0);
  CHECK(index.find(42) == RowIndex::kNone - 1);
  CHECK(index.find(1) == RowIndex::kNone);
  CHECK(index.find(UINT64_MAX - 1) == RowIndex::kNone);
  CHECK(index.capacity() == 16);
  CHECK(index.bytes_held() == 16 * 16);
}

TEST_CASE("an id inserted twice or with no slot is a broken precondition") {
  RowIndex index;
  index.insert(5, 1);
  CHECK_THROWS_AS(index.insert(5, 2), std::logic_error);
  CHECK_THROWS_AS(index.insert(6, RowIndex::kNone), std::logic_error);
  CHECK(index.find(5) == 1);
  CHECK(index.size() == 1);
}

TEST_CASE("the index doubles past 3/4 full and bytes_holding foretells it") {
  RowIndex index;
  CHECK(index.bytes_holding(0) == 0);
  CHECK(index.bytes_holding(1) == 16 * 16);
  CHECK(index.bytes_holding(12) == 16 * 16);
  CHECK(index.bytes_holding(13) == 32 * 16);
  CHECK(index.bytes_holding(100) == 256 * 16);
  for (uint32_t k = 0; k < 12; ++k) index.insert(k * 1000, k);
  CHECK(index.capacity() == 16);
  index.insert(12000, 12);
  CHECK(index.capacity() == 32);
  for (uint32_t k = 13; k < 10000; ++k) {
    const uint64_t before = index.bytes_holding(k + 1);
    index.insert(k * 1000, k);
    REQUIRE(index.bytes_held() == before);
  }
  CHECK(index.capacity() == 16384);
  for (uint32_t k = 0; k < 10000; ++k) REQUIRE(index.find(k * 1000) == k);
}

TEST_CASE("reserve makes room once and keeps what is held") {
  RowIndex index;
  index.insert(3, 30);
  index.reserve(1000);
  CHECK(index.capacity() == 2048);
  CHECK(index.find(3) == 30);
  for (uint32_t k = 0; k < 999; ++k) index.insert(uint64_t{k} << 32 | 1, k);
  CHECK(index.capacity() == 2048);
  index.reserve(10);
  CHECK(index.capacity() == 2048);
}

TEST_CASE("ids sharing their home entry are found and erased in any order") {
  // Ids in a run of a small table collide in clusters; erase shifts the entries after one
  // back, so every id left must still be found, whichever went first.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    CAPTURE(seed);
    RowIndex index;
    std::unordered_map<uint64_t, uint32_t> model;
    for (uint32_t k = 0; k < 12; ++k) {
      index.insert(k, k + 100);
      model[k] = k + 100;
    }
    std::mt19937_64 random(seed);
    std::vector<uint64_t> order{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    std::shuffle(order.begin(), order.end(), random);
    for (uint64_t id : order) {
      CHECK(index.erase(id));
      CHECK_FALSE(index.erase(id));
      model.erase(id);
      check_same(index, model);
      CHECK(index.find(id) == RowIndex::kNone);
    }
    CHECK(index.capacity() == 16);
  }
}

TEST_CASE("many random inserts, lookups and erases agree with std::unordered_map") {
  for (uint64_t range : {uint64_t{64}, uint64_t{5000}, uint64_t{1} << 40, uint64_t{0}}) {
    CAPTURE(range);
    std::mt19937_64 random(range + 1);
    auto draw = [&] { return range ? random() % range : random(); };
    RowIndex index;
    std::unordered_map<uint64_t, uint32_t> model;
    uint32_t next_slot = 0;
    for (int op = 0; op < 200000; ++op) {
      const uint64_t id = draw();
      const auto it = model.find(id);
      switch (random() % 4) {
        case 0:
        case 1:  // insert where not held
          if (it == model.end()) {
            index.insert(id, next_slot);
            model[id] = next_slot++;
          }
          break;
        case 2:  // erase
          REQUIRE(index.erase(id) == (it != model.end()));
          if (it != model.end()) model.erase(it);
          break;
        default:  // look up
          REQUIRE(index.find(id) == (it == model.end() ? RowIndex::kNone : it->second));
      }
    }
    check_same(index, model);
    CHECK(index.size() <= index.capacity() / 4 * 3);
  }
}

TEST_CASE("a moved index holds the ids, the one moved from none") {
  RowIndex index;
  for (uint32_t k = 0; k < 100; ++k) index.insert(k * 7, k);
  RowIndex moved = std::move(index);
  CHECK(moved.size() == 100);
  CHECK(moved.find(693) == 99);
  CHECK(index.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is empty, by contract
  CHECK(index.find(693) == RowIndex::kNone);
  index = std::move(moved);
  CHECK(index.find(0) == 0);
}
