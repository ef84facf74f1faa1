// SPDX-License-Identifier: Apache-2.0
#include "common/interval_set.h"

#include <algorithm>

namespace psched {

void IntervalSet::add(ElementRange r) {
  if (r.begin >= r.end) return;
  subtract(r);  // then r is disjoint from the set; merge with touching neighbours
  auto next = ranges_.lower_bound(r.begin);
  if (next != ranges_.end() && next->first == r.end) {
    r.end = next->second;
    size_ -= next->second - next->first;
    next = ranges_.erase(next);
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == r.begin) {
      r.begin = prev->first;
      size_ -= prev->second - prev->first;
      ranges_.erase(prev);
    }
  }
  ranges_[r.begin] = r.end;
  size_ += r.size();
}

void IntervalSet::subtract(ElementRange r) {
  if (r.begin >= r.end) return;
  auto it = ranges_.upper_bound(r.begin);
  if (it != ranges_.begin()) --it;
  while (it != ranges_.end() && it->first < r.end) {
    uint64_t begin = it->first, end = it->second;
    if (end <= r.begin) {
      ++it;
      continue;
    }
    it = ranges_.erase(it);
    size_ -= end - begin;
    if (begin < r.begin) {
      ranges_[begin] = r.begin;
      size_ += r.begin - begin;
    }
    if (end > r.end) {
      ranges_[r.end] = end;
      size_ += end - r.end;
      break;
    }
  }
}

bool IntervalSet::contains(ElementRange r) const {
  if (r.begin >= r.end) return true;
  auto it = ranges_.upper_bound(r.begin);
  if (it == ranges_.begin()) return false;
  --it;
  return it->first <= r.begin && r.end <= it->second;
}

bool IntervalSet::overlaps(ElementRange r) const {
  if (r.begin >= r.end) return false;
  auto it = ranges_.lower_bound(r.end);
  if (it == ranges_.begin()) return false;
  --it;
  return it->second > r.begin;
}

void IntervalSet::clear() {
  ranges_.clear();
  size_ = 0;
}

std::vector<ElementRange> IntervalSet::ranges() const {
  std::vector<ElementRange> out;
  out.reserve(ranges_.size());
  for (auto& [b, e] : ranges_) out.push_back({b, e});
  return out;
}

IntervalSet IntervalSet::intersect(const IntervalSet& other) const {
  IntervalSet out;
  auto a = ranges_.begin(), b = other.ranges_.begin();
  while (a != ranges_.end() && b != other.ranges_.end()) {
    uint64_t begin = std::max(a->first, b->first), end = std::min(a->second, b->second);
    if (begin < end) out.add({begin, end});
    (a->second < b->second) ? ++a : ++b;
  }
  return out;
}

}  // namespace psched
