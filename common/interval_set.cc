// SPDX-License-Identifier: Apache-2.0
#include "common/interval_set.h"

#include <algorithm>

namespace psched {

IntervalSet::Ranges::iterator IntervalSet::first_ending_after(uint64_t index) {
  return std::partition_point(ranges_.begin(), ranges_.end(),
                              [index](const ElementRange& r) { return r.end <= index; });
}

IntervalSet::Ranges::const_iterator IntervalSet::first_ending_after(uint64_t index) const {
  return std::partition_point(ranges_.begin(), ranges_.end(),
                              [index](const ElementRange& r) { return r.end <= index; });
}

void IntervalSet::add(ElementRange r) {
  if (r.begin >= r.end) return;
  // The ranges that overlap or touch r: from the first ending at or after r.begin to the last
  // beginning at or before r.end. They merge with r into one.
  auto first = std::partition_point(ranges_.begin(), ranges_.end(),
                                    [&r](const ElementRange& x) { return x.end < r.begin; });
  auto last = std::partition_point(first, ranges_.end(),
                                   [&r](const ElementRange& x) { return x.begin <= r.end; });
  if (first == last) {
    ranges_.insert(first, r);
    size_ += r.size();
    return;
  }
  for (auto it = first; it != last; ++it) size_ -= it->size();
  ElementRange merged{std::min(r.begin, first->begin), std::max(r.end, std::prev(last)->end)};
  *first = merged;
  size_ += merged.size();
  ranges_.erase(std::next(first), last);
}

void IntervalSet::subtract(ElementRange r) {
  if (r.begin >= r.end) return;
  auto first = first_ending_after(r.begin);
  auto last = std::partition_point(first, ranges_.end(),
                                   [&r](const ElementRange& x) { return x.begin < r.end; });
  if (first == last) return;
  ElementRange left{first->begin, r.begin}, right{r.end, std::prev(last)->end};
  for (auto it = first; it != last; ++it) size_ -= it->size();
  auto at = ranges_.erase(first, last);
  if (right.begin < right.end) {
    at = ranges_.insert(at, right);
    size_ += right.size();
  }
  if (left.begin < left.end) {
    ranges_.insert(at, left);
    size_ += left.size();
  }
}

bool IntervalSet::contains(ElementRange r) const {
  if (r.begin >= r.end) return true;
  auto it = first_ending_after(r.begin);
  return it != ranges_.end() && it->contains(r);
}

bool IntervalSet::overlaps(ElementRange r) const {
  if (r.begin >= r.end) return false;
  auto it = first_ending_after(r.begin);
  return it != ranges_.end() && it->begin < r.end;
}

void IntervalSet::clear() {
  ranges_.clear();
  size_ = 0;
}

IntervalSet IntervalSet::intersect(const IntervalSet& other) const {
  IntervalSet out;
  auto a = ranges_.begin(), b = other.ranges_.begin();
  while (a != ranges_.end() && b != other.ranges_.end()) {
    uint64_t begin = std::max(a->begin, b->begin), end = std::min(a->end, b->end);
    if (begin < end) out.add({begin, end});
    (a->end < b->end) ? ++a : ++b;
  }
  return out;
}

}  // namespace psched
