#include "bench/fluid_model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <set>

#include "common/check.h"

namespace psched::bench {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// One direction of the link. Holds at most one pending tensor per layer (the model guarantees
// it: a layer's next tensor cannot be ready before its previous one was delivered) and gives
// the whole rate to one of them: the lowest layer (priority) or the oldest (fifo). Work is
// counted in seconds of the whole link (bytes / rate), so an infinite rate is just 0 seconds.
class FluidLink {
 public:
  FluidLink(FluidPolicy policy, size_t layers) : policy_(policy), remaining_s_(layers, 0) {}

  // `layer`'s tensor, needing `seconds` of the whole link, is ready now.
  void add(size_t layer, double seconds) {
    PSCHED_REQUIRE(!pending_.contains(layer), layer);
    pending_.insert(layer);
    if (policy_ == FluidPolicy::fifo) arrivals_.push_back(layer);
    remaining_s_[layer] = seconds;
    busy_s_ += seconds;
  }

  // When the tensor being served finishes if nothing preempts it; kNever when idle.
  double next_finish(double now) const {
    return pending_.empty() ? kNever : now + remaining_s_[head()];
  }

  // Serves the head for `dt` seconds (the head cannot change between two events).
  void advance(double dt) {
    if (pending_.empty()) return;
    double& left = remaining_s_[head()];
    left = std::max(0.0, left - dt);
  }

  // Removes the head, which has just finished, and returns its layer.
  size_t finish_head() {
    size_t layer = head();
    pending_.erase(layer);
    if (policy_ == FluidPolicy::fifo) arrivals_.pop_front();
    remaining_s_[layer] = 0;
    return layer;
  }

  double busy_s() const { return busy_s_; }

 private:
  size_t head() const {
    return policy_ == FluidPolicy::priority ? *pending_.begin() : arrivals_.front();
  }

  FluidPolicy policy_;
  std::vector<double> remaining_s_;  // per layer; meaningful while the layer is pending
  std::set<size_t> pending_;         // pending layers, lowest first
  std::deque<size_t> arrivals_;      // fifo only: pending layers in the order they became ready
  double busy_s_ = 0;                // sum of the seconds of every tensor added
};

// The event-driven simulation of `simulate_fluid`. Events: a compute task ends, an upstream
// transfer ends, a downstream transfer ends. Between events all rates are constant.
class FluidSimulation {
 public:
  FluidSimulation(const std::vector<FluidLayer>& layers, double rate, FluidPolicy policy,
                  int iterations)
      : layers_(layers),
        rate_(rate),
        iterations_(iterations),
        fresh_back_(layers.size(), 0),
        up_(policy, layers.size()),
        down_(policy, layers.size()) {}

  FluidResult run() {
    try_start_compute();
    while (step_once()) {
    }
    PSCHED_REQUIRE(finished_compute_, iteration_, step_, now_);  // a stall would be a bug
    FluidResult result;
    result.iteration_starts = starts_;
    result.upstream_busy_s = up_.busy_s();
    result.downstream_busy_s = down_.busy_s();
    result.finish_s = now_;
    return result;
  }

 private:
  size_t layer_count() const { return layers_.size(); }
  double transfer_s(size_t layer) const { return layers_[layer].bytes / rate_; }
  bool is_forward(size_t step) const { return step < layer_count(); }
  // The layer of step `step`: forwards run layers 0..L-1, backwards L-1..0.
  size_t layer_of(size_t step) const {
    return is_forward(step) ? step : 2 * layer_count() - 1 - step;
  }

  // Advances to the next event and handles it; false when nothing is left to happen.
  bool step_once() {
    double compute_at = compute_end_;
    double up_at = up_.next_finish(now_);
    double down_at = down_.next_finish(now_);
    double at = std::min({compute_at, up_at, down_at});
    if (at == kNever) return false;
    up_.advance(at - now_);
    down_.advance(at - now_);
    now_ = at;
    if (compute_at == at) {
      on_compute_done();
    } else if (up_at == at) {
      on_upstream_done();
    } else {
      on_downstream_done();
    }
    return true;
  }

  // The compute task at (iteration_, step_) has ended. Steps 0..L-1 are forwards of layers
  // 0..L-1; steps L..2L-1 are backwards of layers L-1..0.
  void on_compute_done() {
    compute_end_ = kNever;
    if (!is_forward(step_)) up_.add(layer_of(step_), transfer_s(layer_of(step_)));
    if (++step_ == 2 * layer_count()) {
      step_ = 0;
      ++iteration_;
    }
    try_start_compute();
  }

  // A gradient is fully sent: its fresh value is ready for downstream at once.
  void on_upstream_done() {
    size_t layer = up_.finish_head();
    down_.add(layer, transfer_s(layer));
  }

  // A fresh value is back: the forward waiting for it may start.
  void on_downstream_done() {
    ++fresh_back_[down_.finish_head()];
    try_start_compute();
  }

  // Starts the next compute task if the device is free and its inputs are there. A forward of
  // layer i in iteration k (0-based) needs layer i's fresh value of iteration k - 1.
  void try_start_compute() {
    if (compute_end_ != kNever || finished_compute_) return;
    if (is_forward(step_) && fresh_back_[step_] < iteration_) return;
    if (step_ == 0) {
      starts_.push_back(now_);
      if (iteration_ == iterations_) {
        finished_compute_ = true;  // iteration N + 1 would start now; it is not simulated
        return;
      }
    }
    const FluidLayer& layer = layers_[layer_of(step_)];
    compute_end_ = now_ + (is_forward(step_) ? layer.forward_s : layer.backward_s);
  }

  const std::vector<FluidLayer>& layers_;  // borrowed: the caller outlives the simulation
  double rate_;
  int iterations_;
  double now_ = 0;
  int iteration_ = 0;              // 0-based iteration of the next or running compute task
  size_t step_ = 0;                // its step within the iteration, 0 .. 2L-1
  double compute_end_ = kNever;    // when the running compute task ends; kNever when none
  bool finished_compute_ = false;  // iteration N + 1's start has been recorded
  std::vector<int> fresh_back_;    // per layer: how many iterations' fresh values are back
  FluidLink up_;
  FluidLink down_;
  std::vector<double> starts_;
};

void check_inputs(const std::vector<FluidLayer>& layers, double rate, int iterations) {
  PSCHED_REQUIRE(!layers.empty(), layers.size());
  PSCHED_REQUIRE(rate > 0, rate);
  PSCHED_REQUIRE(iterations >= 3, iterations);
  for (size_t i = 0; i < layers.size(); ++i) {
    const FluidLayer& l = layers[i];
    PSCHED_REQUIRE(std::isfinite(l.forward_s) && l.forward_s >= 0, i, l.forward_s);
    PSCHED_REQUIRE(std::isfinite(l.backward_s) && l.backward_s >= 0, i, l.backward_s);
    PSCHED_REQUIRE(std::isfinite(l.bytes) && l.bytes >= 0, i, l.bytes);
  }
}

// Median of the durations of iterations 3..N (1-based).
double steady_iteration_s(const std::vector<double>& starts) {
  std::vector<double> durations;
  for (size_t k = 2; k + 1 < starts.size(); ++k) durations.push_back(starts[k + 1] - starts[k]);
  std::sort(durations.begin(), durations.end());
  size_t n = durations.size();
  return n % 2 == 1 ? durations[n / 2] : (durations[n / 2 - 1] + durations[n / 2]) / 2;
}

}  // namespace

FluidResult simulate_fluid(const std::vector<FluidLayer>& layers, double link_bytes_per_s,
                           FluidPolicy policy, int iterations) {
  check_inputs(layers, link_bytes_per_s, iterations);
  FluidResult result = FluidSimulation(layers, link_bytes_per_s, policy, iterations).run();
  result.compute_s = compute_only_s(layers);
  result.iteration_s = steady_iteration_s(result.iteration_starts);
  return result;
}

double compute_only_s(const std::vector<FluidLayer>& layers) {
  double total = 0;
  for (const FluidLayer& l : layers) total += l.forward_s + l.backward_s;
  return total;
}

double balanced_link_rate(const std::vector<FluidLayer>& layers) {
  double compute = compute_only_s(layers);
  PSCHED_REQUIRE(compute > 0, compute, layers.size());
  double bytes = 0;
  for (const FluidLayer& l : layers) bytes += l.bytes;
  return bytes / compute;
}

const char* to_string(FluidPolicy policy) {
  return policy == FluidPolicy::priority ? "priority" : "fifo";
}

}  // namespace psched::bench
