// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_order.h"

#include <algorithm>
#include <array>
#include <bit>
#include <numeric>
#include <utility>

#include "common/check.h"

namespace psched {
namespace {

constexpr int kMaxDigitBits = 11;
// Below this many ids a comparison sort is as fast as a pass's counts.
constexpr size_t kFewIds = 256;

// The ids and positions of `from` into `to`, stably by the digit of `bits` bits at `shift`.
void scatter(int shift, int bits, std::span<const uint64_t> from_ids,
             std::span<const uint32_t> from, std::span<uint64_t> to_ids, std::span<uint32_t> to) {
  std::array<uint32_t, size_t{1} << kMaxDigitBits> start{};
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (uint64_t id : from_ids) ++start[(id >> shift) & mask];
  uint32_t at = 0;
  for (uint32_t& s : std::span(start).first(mask + 1)) at += std::exchange(s, at);
  for (size_t k = 0; k < from.size(); ++k) {
    const uint32_t into = start[(from_ids[k] >> shift) & mask]++;
    to_ids[into] = from_ids[k];
    to[into] = from[k];
  }
}

}  // namespace

std::vector<uint32_t> order_by_id(std::span<const uint64_t> ids) {
  PSCHED_REQUIRE(ids.size() <= UINT32_MAX, ids.size());
  std::vector<uint32_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0u);
  if (ids.size() <= kFewIds) {
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
    return order;
  }
  const int width = std::bit_width(*std::max_element(ids.begin(), ids.end()));
  const int passes = std::max(1, (width + kMaxDigitBits - 1) / kMaxDigitBits);
  const int bits = (width + passes - 1) / passes;
  std::vector<uint64_t> keys(ids.begin(), ids.end()), keys_to(ids.size());
  std::vector<uint32_t> order_to(ids.size());
  for (int pass = 0; pass < passes; ++pass) {
    scatter(pass * bits, bits, keys, order, keys_to, order_to);
    keys.swap(keys_to);
    order.swap(order_to);
  }
  return order;
}

}  // namespace psched
