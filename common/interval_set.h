// SPDX-License-Identifier: Apache-2.0
// A set of element indices stored as sorted, disjoint, non-adjacent half-open ranges. Tracks
// which parts of a variable an update has covered (applied, received from a worker, ...).
#pragma once

#include <cstdint>
#include <vector>

#include "common/placement.h"

namespace psched {

class IntervalSet {
 public:
  // Adds [r.begin, r.end), merging with touching ranges. Empty ranges are ignored.
  void add(ElementRange r);
  // Removes [r.begin, r.end).
  void subtract(ElementRange r);
  // True when every index of `r` is in the set (an empty `r` is always contained).
  bool contains(ElementRange r) const;
  // True when some index of `r` is in the set.
  bool overlaps(ElementRange r) const;
  // Number of indices in the set.
  uint64_t size() const { return size_; }
  bool empty() const { return ranges_.empty(); }
  // Empties the set; it keeps its memory for what is added next.
  void clear();
  // The ranges, in order; valid until the set changes.
  const std::vector<ElementRange>& ranges() const { return ranges_; }
  // Indices in both sets.
  IntervalSet intersect(const IntervalSet& other) const;

 private:
  using Ranges = std::vector<ElementRange>;
  // The first range that ends after `index` (contains it, or lies wholly behind it).
  Ranges::iterator first_ending_after(uint64_t index);
  Ranges::const_iterator first_ending_after(uint64_t index) const;

  // Sorted; a set holds a few ranges (a variable's pushed partitions merge as they arrive),
  // so a vector beats a tree and allocates only when it grows.
  Ranges ranges_;
  uint64_t size_ = 0;
};

}  // namespace psched
