// SPDX-License-Identifier: Apache-2.0
#include "common/histogram.h"

#include <algorithm>

namespace psched {

Histogram::Histogram(std::span<const double> upper_bounds)
    : bounds_(upper_bounds), counts_(upper_bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[static_cast<size_t>(bucket)];
  ++count_;
  sum_ += value;
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> cumulative(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) cumulative[i] = running += counts_[i];
  return cumulative;
}

}  // namespace psched
