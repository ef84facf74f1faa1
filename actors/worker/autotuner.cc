// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/autotuner.h"

#include <algorithm>
#include <cmath>

namespace psched {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

Autotuner::Autotuner(TuningPoint start, AutotunerOptions options)
    : options_(options), current_(clamp(start)), to_settle_(options.settle_iterations) {
  begin_search(current_);
}

TuningPoint Autotuner::clamp(TuningPoint p) const {
  uint64_t max_partition = std::min(options_.max_partition_bytes, options_.max_credit_bytes);
  p.partition_bytes = std::clamp(p.partition_bytes, options_.min_partition_bytes,
                                 std::max(options_.min_partition_bytes, max_partition));
  p.credit_bytes = std::clamp(p.credit_bytes, p.partition_bytes,
                              std::max(p.partition_bytes, options_.max_credit_bytes));
  return p;
}

std::vector<TuningPoint> Autotuner::neighbours(TuningPoint p) const {
  std::vector<TuningPoint> out;
  auto add = [&](TuningPoint q) {
    q = clamp(q);
    if (q != p && std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
  };
  uint64_t k = step_;
  add({p.partition_bytes * k, std::max(p.credit_bytes, p.partition_bytes * k)});
  add({p.partition_bytes / k, p.credit_bytes});
  add({p.partition_bytes, p.credit_bytes * k});
  if (p.credit_bytes / k >= p.partition_bytes) add({p.partition_bytes, p.credit_bytes / k});
  // Both together, keeping partitions per window: the valley often runs along this diagonal.
  add({p.partition_bytes / k, p.credit_bytes / k});
  add({p.partition_bytes * k, p.credit_bytes * k});
  return out;
}

void Autotuner::begin_search(TuningPoint center) {
  phase_ = Phase::searching;
  ++searches_;
  costs_.clear();
  step_ = std::max<uint64_t>(2, options_.first_step);
  center_ = center;
  pending_ = neighbours(center);
}

std::optional<TuningPoint> Autotuner::next_candidate() {
  while (!pending_.empty()) {
    TuningPoint p = pending_.front();
    pending_.erase(pending_.begin());
    if (!costs_.contains(p)) return p;
  }
  return std::nullopt;
}

TuningPoint Autotuner::finish_round() {
  TuningPoint best = center_;
  for (TuningPoint n : neighbours(center_))
    if (costs_.contains(n) && costs_[n] < costs_[best]) best = n;
  if (best != center_ && costs_[best] < costs_[center_] * (1 - options_.min_gain)) {
    center_ = best;
    pending_ = neighbours(best);
    if (auto next = next_candidate()) return *next;
    return finish_round();  // every neighbour of the new center is measured already
  }
  if (step_ > 2) {  // nothing better this far away: look closer
    step_ /= 2;
    pending_ = neighbours(center_);
    if (auto next = next_candidate()) return *next;
    return finish_round();
  }
  phase_ = Phase::watching;
  tuned_seconds_ = costs_[center_];
  return center_;
}

std::optional<TuningPoint> Autotuner::switch_to(TuningPoint p) {
  samples_.clear();
  if (p == current_) return std::nullopt;
  current_ = p;
  to_settle_ = options_.settle_iterations;
  return p;
}

std::optional<TuningPoint> Autotuner::observe(double seconds) {
  if (to_settle_ > 0) {
    --to_settle_;
    return std::nullopt;
  }
  samples_.push_back(seconds);
  size_t window = static_cast<size_t>(std::max(1, options_.measure_iterations));
  if (phase_ == Phase::watching) {
    if (samples_.size() > window) samples_.erase(samples_.begin());
    if (samples_.size() < window) return std::nullopt;
    double now = median(samples_);
    if (std::abs(now - tuned_seconds_) <= options_.drift * tuned_seconds_) return std::nullopt;
    begin_search(current_);
    costs_[current_] = now;  // the drifted time is the center's fresh measurement
    if (auto next = next_candidate()) return switch_to(*next);
    return switch_to(finish_round());
  }
  if (samples_.size() < window) return std::nullopt;
  costs_[current_] = median(samples_);
  if (auto next = next_candidate()) return switch_to(*next);
  return switch_to(finish_round());
}

}  // namespace psched
