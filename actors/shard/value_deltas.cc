// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/value_deltas.h"

#include <algorithm>
#include <iterator>

#include "common/check.h"
#include "common/wall_clock.h"
#include "compression/codec.h"

namespace psched {
namespace {

bool overlap(ElementRange a, ElementRange b) {
  return a.begin < b.end && b.begin < a.end;
}

}  // namespace

void ValueDeltas::changed(ElementRange range) {
  for (const auto& p : ranges_)
    if (overlap(p->range, range)) p->changed = true;
}

DeltaReply ValueDeltas::answer(DType dtype, ElementRange range, std::span<const std::byte> current,
                               const DeltaAsk& ask, std::vector<std::byte>& body) {
  PSCHED_REQUIRE(current.size() == range.size() * element_bytes(dtype), current.size());
  bool started = false;
  Published& p = find_or_start(range, current, started);
  if (started || ask.count == 0) return whole(p);
  if (ask.refresh) {
    // The first of a step's refreshes publishes V whole; the others find it and take it.
    if (p.changed || p.ring.empty() || !p.ring.back().whole) publish_whole(p, current, ask);
    return whole(p);
  }
  if (p.changed) {
    publish(dtype, p, current, ask, body);
    if (ask.base + 1 == p.version) return {true, p.version, {}};
  }
  // A worker behind the ring (the oldest delta it lacked may have left it for the new one),
  // or behind a whole version, takes P whole.
  if (!answerable(p, ask.base)) return whole(p);
  union_since(dtype, p, ask.base, body);
  return {true, p.version, {}};
}

ValueDeltas::Published& ValueDeltas::find_or_start(ElementRange range,
                                                   std::span<const std::byte> current,
                                                   bool& started) {
  for (const auto& p : ranges_)
    if (p->range == range) return *p;
  std::erase_if(ranges_, [&](const auto& p) { return overlap(p->range, range); });
  started = true;
  const auto now = static_cast<uint64_t>(wall_clock_ns());
  Published& p = *ranges_.emplace_back(std::make_unique<Published>());
  p.range = range;
  p.copy.assign(current.begin(), current.end());
  p.first = p.version = std::max<uint64_t>(now, 1);
  return p;
}

void ValueDeltas::publish(DType dtype, Published& p, std::span<const std::byte> current,
                          const DeltaAsk& ask, std::vector<std::byte>& body) {
  Version next;
  encode_delta(dtype, current, p.copy, ask.count, body, next.indices);
  keep(p, std::move(next), ask);
}

void ValueDeltas::publish_whole(Published& p, std::span<const std::byte> current,
                                const DeltaAsk& ask) {
  std::copy(current.begin(), current.end(), p.copy.begin());
  keep(p, Version{.whole = true, .indices = {}}, ask);
}

void ValueDeltas::keep(Published& p, Version version, const DeltaAsk& ask) {
  p.ring.push_back(std::move(version));
  while (p.ring.size() > std::max<uint32_t>(ask.ring, 1)) p.ring.pop_front();
  ++p.version;
  p.changed = false;
  ++published_;
}

bool ValueDeltas::answerable(const Published& p, uint64_t base) {
  if (base < p.first || base > p.version || p.version - base > p.ring.size()) return false;
  const auto behind = static_cast<ptrdiff_t>(p.version - base);
  return std::none_of(p.ring.end() - behind, p.ring.end(),
                      [](const Version& v) { return v.whole; });
}

void ValueDeltas::union_since(DType dtype, const Published& p, uint64_t base,
                              std::vector<std::byte>& body) {
  const uint64_t behind = p.version - base;  // the newest `behind` deltas of the ring
  std::vector<uint32_t> indices, merged;
  for (auto it = p.ring.end() - static_cast<ptrdiff_t>(behind); it != p.ring.end(); ++it) {
    merged.clear();
    std::set_union(indices.begin(), indices.end(), it->indices.begin(), it->indices.end(),
                   std::back_inserter(merged));
    indices.swap(merged);
  }
  encode_delta_at(dtype, p.copy, indices, body);
}

uint64_t ValueDeltas::bytes() const {
  uint64_t total = 0;
  for (const auto& p : ranges_) {
    total += p->copy.size();
    for (const Version& v : p->ring) total += v.indices.size() * sizeof(uint32_t);
  }
  return total;
}

}  // namespace psched
