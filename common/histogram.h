// SPDX-License-Identifier: Apache-2.0
// Histogram: counts of observed values (seconds, bytes, ...) in fixed buckets, Prometheus
// style. A plain value type: its owner updates it on one thread (an actor's loop) and hands
// out copies as snapshots, so readers never touch the live one.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace psched {

// Upper bounds in seconds for latencies from ten microseconds to thirty seconds.
inline constexpr std::array<double, 14> kLatencyBucketsSeconds = {
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30};

class Histogram {
 public:
  // Buckets for latencies, kLatencyBucketsSeconds.
  Histogram() : Histogram(kLatencyBucketsSeconds) {}
  // `upper_bounds` ascending; a last bucket (+Inf) is implied. The bounds must outlive the
  // histogram and its copies (use static arrays such as kLatencyBucketsSeconds).
  explicit Histogram(std::span<const double> upper_bounds);

  void observe(double value);

  std::span<const double> upper_bounds() const { return bounds_; }
  // Observations <= upper_bounds()[i], for each bound and then +Inf (so the last is count()).
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::span<const double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last one is +Inf
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace psched
