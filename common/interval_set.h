// SPDX-License-Identifier: Apache-2.0
// A set of element indices stored as sorted, disjoint, non-adjacent half-open ranges. Tracks
// which parts of a variable an update has covered (applied, received from a worker, ...).
#pragma once

#include <cstdint>
#include <map>
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
  void clear();
  // The ranges, in order.
  std::vector<ElementRange> ranges() const;
  // Indices in both sets.
  IntervalSet intersect(const IntervalSet& other) const;

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end
  uint64_t size_ = 0;
};

}  // namespace psched
