// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_capacity.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/check.h"
#include "common/error.h"

namespace psched {
namespace {

constexpr uint64_t kSketchSalt = 0xA0761D6478BD642Full;
constexpr uint64_t kMinCounters = uint64_t{1} << 12, kMaxCounters = uint64_t{1} << 24;

}  // namespace

RowCapacity::RowCapacity(const TableSpec& spec)
    : max_rows_(spec.max_rows), admit_after_(spec.admit_after) {
  if (admit_after_ <= 1) return;
  const uint64_t rows = spec.max_rows ? spec.max_rows : spec.num_embeddings;
  const uint64_t counters = std::clamp(std::bit_ceil(8 * rows), kMinCounters, kMaxCounters);
  mask_ = counters - 1;
  sketch_.assign(2 * counters, 0);
}

std::pair<uint64_t, uint64_t> RowCapacity::counters(uint64_t id) const {
  const uint64_t h = mix64(id ^ kSketchSalt);
  return {h & mask_, mask_ + 1 + ((h >> 32) & mask_)};
}

bool RowCapacity::admit(uint64_t id) {
  if (admit_after_ <= 1) return true;
  const auto [a, b] = counters(id);
  const uint8_t seen = std::min(sketch_[a], sketch_[b]);
  if (seen + 1u >= admit_after_) return true;
  // Conservative update: only the counters at the minimum grow, so hot neighbours inflate less.
  for (uint64_t at : {a, b})
    if (sketch_[at] == seen) ++sketch_[at];
  ++dropped_;
  return false;
}

void RowCapacity::added(uint32_t slot) {
  if (!tracks_order()) return;
  if (slot >= older_.size()) {
    older_.resize(slot + 1, kNone);
    newer_.resize(slot + 1, kNone);
  }
  link_newest(slot);
}

void RowCapacity::make_newest(uint32_t slot) {
  unlink(slot);
  link_newest(slot);
}

void RowCapacity::unlink(uint32_t slot) {
  const uint32_t before = older_[slot], after = newer_[slot];
  (before == kNone ? oldest_ : newer_[before]) = after;
  (after == kNone ? newest_ : older_[after]) = before;
}

void RowCapacity::link_newest(uint32_t slot) {
  older_[slot] = newest_;
  newer_[slot] = kNone;
  (newest_ == kNone ? oldest_ : newer_[newest_]) = slot;
  newest_ = slot;
}

uint64_t RowCapacity::bytes_held() const {
  return (older_.capacity() + newer_.capacity()) * sizeof(uint32_t) + sketch_.capacity();
}

std::vector<uint32_t> RowCapacity::order() const {
  std::vector<uint32_t> slots;
  for (uint32_t slot = oldest_; slot != kNone; slot = newer_[slot]) slots.push_back(slot);
  return slots;
}

void RowCapacity::merge_sketch(const RowCapacity& other) {
  PSCHED_REQUIRE(other.sketch_.size() == sketch_.size(), other.sketch_.size(), sketch_.size());
  for (size_t at = 0; at < sketch_.size(); ++at)
    sketch_[at] = std::max(sketch_[at], other.sketch_[at]);
}

void RowCapacity::save(ByteWriter& out, uint64_t rows) const {
  out.put(evicted_);
  out.put(dropped_);
  out.blob(std::as_bytes(std::span(sketch_)));
  if (!tracks_order()) return;
  uint64_t listed = 0;
  for (uint32_t slot = oldest_; slot != kNone; slot = newer_[slot], ++listed) out.put(slot);
  PSCHED_REQUIRE(listed == rows, listed, rows);
}

void RowCapacity::load(ByteReader& in, uint64_t rows) {
  evicted_ = in.get<uint64_t>();
  dropped_ = in.get<uint64_t>();
  std::span<const std::byte> sketch = in.blob();
  if (sketch.size() != sketch_.size())
    fail(ErrorCode::corrupt_checkpoint, "{}: an admission sketch of {} bytes, not {}", in.what(),
         sketch.size(), sketch_.size());
  std::memcpy(sketch_.data(), sketch.data(), sketch.size());
  if (!tracks_order()) return;
  if (rows > max_rows_)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} rows stored beyond max_rows {}", in.what(), rows,
         max_rows_);
  std::vector<bool> seen(rows);
  for (uint64_t k = 0; k < rows; ++k) {
    const auto slot = in.get<uint32_t>();
    if (slot >= rows || seen[slot])
      fail(ErrorCode::corrupt_checkpoint, "{}: slot {} listed twice or past the {} rows", in.what(),
           slot, rows);
    seen[slot] = true;
    added(slot);
  }
}

}  // namespace psched
