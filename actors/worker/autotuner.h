// SPDX-License-Identifier: Apache-2.0
// Autotuner: tunes partition_bytes and credit_bytes while training runs, from measured
// iteration times, with no restart.
//
// The search is a compass search on a grid of powers of two: from the current point it
// measures the point itself and its neighbours at the current step (partition x step and
// / step, credit x step and / step, and both together, keeping credit >= partition and both
// within bounds), moves
// to the best one when it beats the current point by more than `min_gain`, and otherwise
// halves the step, from `first_step` down to 2; it stops when no neighbour at step 2 beats it.
// The wide first step sees past a shallow slope that a gain threshold would stop at. Each point is
// measured as the median of `measure_iterations` iterations after `settle_iterations` ignored ones
// (the first iteration after a change still carries the old setting's transfers). Once converged it
// watches the median of the latest iterations and searches again, from where it is, when that
// drifts from the tuned time by more than `drift` (a changed model, network or load).
//
// A plain value type with no clock and no threads: the caller feeds it iteration times
// (GradientPusher does, on its loop) and applies what it answers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace psched {

struct TuningPoint {
  uint64_t partition_bytes = 0;
  uint64_t credit_bytes = 0;
  auto operator<=>(const TuningPoint&) const = default;
};

struct AutotunerOptions {
  uint64_t min_partition_bytes = 64 << 10;
  uint64_t max_partition_bytes = 16 << 20;
  uint64_t max_credit_bytes = 256 << 20;
  int settle_iterations = 1;
  int measure_iterations = 3;
  double min_gain = 0.02;   // a move must be this much faster (fraction of the iteration time)
  double drift = 0.10;      // re-tune when iterations drift this far from the tuned time
  uint64_t first_step = 4;  // a power of two, at least 2
};

// What the autotuner is doing, for reports (GradientPusher::tuning, Client::tuning).
struct TuningState {
  bool enabled = false;
  TuningPoint current;
  bool converged = false;
  int searches = 0;
  double tuned_seconds = 0;
  uint64_t iterations = 0;       // iteration times measured so far
  uint64_t converged_after = 0;  // `iterations` when the latest search converged (0: not yet)
};

class Autotuner {
 public:
  // Starts searching from `start` (rounded to the grid and bounds).
  Autotuner(TuningPoint start, AutotunerOptions options = {});

  // One iteration took `seconds` under the setting current() returned before. Returns the
  // setting to use from the next iteration on when it changes.
  std::optional<TuningPoint> observe(double seconds);

  TuningPoint current() const { return current_; }
  bool converged() const { return phase_ == Phase::watching; }
  // The median iteration time of the tuned point (valid once converged).
  double tuned_seconds() const { return tuned_seconds_; }
  // Searches started so far (1 + re-tunes after drift).
  int searches() const { return searches_; }

 private:
  enum class Phase { searching, watching };

  TuningPoint clamp(TuningPoint p) const;
  std::vector<TuningPoint> neighbours(TuningPoint p) const;
  // Begins a search around `center`, which is measured first.
  void begin_search(TuningPoint center);
  // The next point of the search to measure, or nullopt when the round is done.
  std::optional<TuningPoint> next_candidate();
  // Ends a round: moves to the best point or converges. Returns the point to run next.
  TuningPoint finish_round();
  std::optional<TuningPoint> switch_to(TuningPoint p);

  AutotunerOptions options_;
  Phase phase_ = Phase::searching;
  TuningPoint current_;
  int to_settle_;  // iterations still to ignore after a change
  TuningPoint center_;
  uint64_t step_ = 2;
  std::vector<TuningPoint> pending_;     // of this round, still to measure
  std::map<TuningPoint, double> costs_;  // measured in this search
  std::vector<double> samples_;          // of current_, after settling
  double tuned_seconds_ = 0;
  int searches_ = 0;
};

}  // namespace psched
