// SPDX-License-Identifier: Apache-2.0
// psched-row-index-bench: what a row table's id index costs, the one it uses (RowIndex,
// actors/shard/row_index.h) against the maps it could: bytes an id (the heap glibc reports
// before and after the ids go in) and lookups a second of ids it holds, on one core.
//   psched-row-index-bench [--ids N] [--lookups N]
// RowIndex, abseil's flat_hash_map and std::unordered_map always; tsl::robin_map (at its default
// load factor 0.5 and at 0.9) where its header is installed (Debian's robin-map-dev, which
// scripts/setup does not install: the table does not use it). Keys are random ids below 10^12,
// looked up in a random order, one after another (no prefetch: what a row table's lookups cost
// is psched-row-table-bench's to say); the figures row_index.h cites are for 10 million ids.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <CLI/CLI.hpp>
#if __has_include(<tsl/robin_map.h>)
#include <tsl/robin_map.h>
#define PSCHED_HAVE_ROBIN_MAP 1
#endif

#include "actors/shard/row_index.h"
#include "bench/heap_clock.h"

namespace {

using psched::bench::Clock;
using psched::bench::heap_bytes;
using psched::bench::seconds_since;

// Fills a `Map` (made by `make`) with `ids`, each mapped to its position, then looks up
// `lookups`; prints bytes an id, inserts and lookups a second.
template <typename Map, typename Make>
void measure(const char* name, const std::vector<uint64_t>& ids,
             const std::vector<uint64_t>& lookups, Make make) {
  const size_t before = heap_bytes();
  auto start = Clock::now();
  auto* map = new Map(make());
  for (size_t i = 0; i < ids.size(); ++i) map->emplace(ids[i], static_cast<uint32_t>(i));
  const double insert_s = seconds_since(start);
  const size_t held = heap_bytes() - before;
  uint64_t found = 0;
  start = Clock::now();
  for (uint64_t id : lookups) {
    auto it = map->find(id);
    if (it != map->end()) found += it->second;
  }
  const double lookup_s = seconds_since(start);
  std::printf("%-24s %10zu ids %8.1f bytes/id %8.1f M inserts/s %8.1f M lookups/s  (%llu)\n", name,
              ids.size(), double(held) / double(ids.size()), double(ids.size()) / insert_s / 1e6,
              double(lookups.size()) / lookup_s / 1e6, static_cast<unsigned long long>(found));
  delete map;
}

// RowIndex behind the maps' emplace, find and end, for measure().
struct RowIndexMap {
  using Found = std::optional<std::pair<uint64_t, uint32_t>>;
  psched::RowIndex index;
  void emplace(uint64_t id, uint32_t slot) {  // as a map's: nothing when `id` is held
    if (!index.contains(id)) index.insert(id, slot);
  }
  Found find(uint64_t id) const {
    const uint32_t slot = index.find(id);
    return slot == psched::RowIndex::kNone ? Found() : Found({id, slot});
  }
  Found end() const { return {}; }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-row-index-bench: a row table's id index, the map against the others"};
  uint64_t count = 10'000'000, lookups_count = 10'000'000;
  app.add_option("--ids", count, "ids held");
  app.add_option("--lookups", lookups_count, "lookups of held ids, in random order");
  CLI11_PARSE(app, argc, argv);
  std::mt19937_64 random(1);
  std::vector<uint64_t> ids(count), lookups(lookups_count);
  for (uint64_t& id : ids) id = random() % 1'000'000'000'000ull;
  for (uint64_t& id : lookups) id = ids[random() % count];
  measure<RowIndexMap>("psched::RowIndex", ids, lookups, [] { return RowIndexMap(); });
  measure<absl::flat_hash_map<uint64_t, uint32_t>>("absl::flat_hash_map", ids, lookups, [] {
    return absl::flat_hash_map<uint64_t, uint32_t>();
  });
  measure<std::unordered_map<uint64_t, uint32_t>>(
      "std::unordered_map", ids, lookups, [] { return std::unordered_map<uint64_t, uint32_t>(); });
#ifdef PSCHED_HAVE_ROBIN_MAP
  measure<tsl::robin_map<uint64_t, uint32_t>>("tsl::robin_map", ids, lookups,
                                              [] { return tsl::robin_map<uint64_t, uint32_t>(); });
  measure<tsl::robin_map<uint64_t, uint32_t>>("tsl::robin_map lf 0.9", ids, lookups, [] {
    tsl::robin_map<uint64_t, uint32_t> map;
    map.max_load_factor(0.9f);
    return map;
  });
#else
  std::printf("tsl::robin_map: not installed (apt-get install robin-map-dev to compare it)\n");
#endif
  return 0;
}
