// SPDX-License-Identifier: Apache-2.0
#include "bench/fluid_model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <set>

#include "common/check.h"

namespace psched::bench {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr size_t kNone = std::numeric_limits<size_t>::max();

// Work is counted in seconds of the whole link (bytes / rate) throughout, so each direction
// serves at rate 1 (link-second per second) and an infinite rate is just 0 seconds of work.

// Both link directions, as the simulation sees them: a gradient goes in when its backward
// ends; a fresh value comes out when it is fully back downstream. At most one gradient per
// layer is in the network at a time (the model guarantees it: a layer's next gradient needs
// its next forward, which needs the previous fresh value back).
class FluidNetwork {
 public:
  virtual ~FluidNetwork() = default;
  // `layer`'s gradient, needing `seconds` of the whole link, is ready for upstream now.
  virtual void gradient_ready(size_t layer, double seconds) = 0;
  // When the next network event is due if no gradient is added first; kNever when idle.
  virtual double next_event(double now) const = 0;
  // Serves `dt` seconds at the current rates, which are constant up to the next event.
  virtual void advance(double dt) = 0;
  // Handles the event announced by next_event, now due. Returns the layer whose fresh value
  // has just come back completely, or kNone.
  virtual size_t handle_event() = 0;
  double upstream_busy_s() const { return busy_s_; }
  double downstream_busy_s() const { return busy_s_; }  // every byte goes both ways

 protected:
  double busy_s_ = 0;  // sum of the seconds of every gradient added
};

// One direction of a first-come-first-served link: the whole rate goes to the oldest pending
// tensor, sent whole; nothing preempts.
class FifoDirection {
 public:
  explicit FifoDirection(size_t layers) : remaining_s_(layers, 0), pending_(layers, false) {}

  void add(size_t layer, double seconds) {
    PSCHED_REQUIRE(!pending_[layer], layer);
    pending_[layer] = true;
    arrivals_.push_back(layer);
    remaining_s_[layer] = seconds;
  }

  // Link-seconds left to the head's end; kNever when idle.
  double head_left_s() const {
    return arrivals_.empty() ? kNever : remaining_s_[arrivals_.front()];
  }

  void advance(double dt) {
    if (arrivals_.empty()) return;
    double& left = remaining_s_[arrivals_.front()];
    left = std::max(0.0, left - dt);
  }

  // Removes the head, which has just finished, and returns its layer.
  size_t finish_head() {
    size_t layer = arrivals_.front();
    arrivals_.pop_front();
    pending_[layer] = false;
    remaining_s_[layer] = 0;
    return layer;
  }

 private:
  std::vector<double> remaining_s_;  // per layer; meaningful while the layer is pending
  std::vector<bool> pending_;        // per layer
  std::deque<size_t> arrivals_;      // pending layers in the order they became ready
};

// FluidPolicy::fifo: whole tensors, store and forward. A fresh value is ready for downstream
// when its whole gradient has gone up; each direction is first come, first served.
class FifoNetwork final : public FluidNetwork {
 public:
  explicit FifoNetwork(size_t layers) : up_(layers), down_(layers), size_s_(layers, 0) {}

  void gradient_ready(size_t layer, double seconds) override {
    up_.add(layer, seconds);
    size_s_[layer] = seconds;
    busy_s_ += seconds;
  }

  double next_event(double now) const override {
    return now + std::min(up_.head_left_s(), down_.head_left_s());
  }

  void advance(double dt) override {
    up_.advance(dt);
    down_.advance(dt);
  }

  // On a tie the upstream end goes first; the order does not matter (the value it makes ready
  // joins the downstream queue behind the one finishing there).
  size_t handle_event() override {
    if (up_.head_left_s() <= down_.head_left_s()) {
      size_t layer = up_.finish_head();
      down_.add(layer, size_s_[layer]);
      return kNone;
    }
    return down_.finish_head();
  }

 private:
  FifoDirection up_;
  FifoDirection down_;
  std::vector<double> size_s_;  // per layer: its tensors' link-seconds
};

// FluidPolicy::priority, the fluid limit of partitioned strict priority. Per layer in the
// network, up_left (link-seconds of its gradient not yet sent up) and backlog (sent up, not yet
// sent down); its fresh value is back when both are zero. Each byte can go down as soon as it
// has gone up (the server applies it in no time), so within a tensor the two directions
// pipeline.
//
// Upstream: the whole rate to the lowest layer with up_left > 0 (the head h), preemptive.
// Downstream: strict priority by layer, work-conserving, walking the layers in order: a layer
// with backlog > 0 takes all the remaining rate; a layer with backlog 0 takes at most the rate
// at which it is being sent up. Only h is being sent up, at the whole rate, so this walk gives
// the whole downstream rate to one layer d = the lowest of {h} and the layers with a backlog:
//   * d == h: up and down run together, h's backlog stays constant (0 if it was 0);
//   * d != h (d < h, or h absent): d's backlog drains at rate 1 while h's grows at rate 1.
// Events: h's gradient is fully up; d's backlog (d != h) reaches zero, after which d waits
// for upstream (or is done, if its gradient was fully up). Rates change only at events and
// when a gradient is added.
//
// With the same rate both ways no backlog ever forms: a layer gains one only while a lower
// layer with a backlog holds the downstream, and at the start there is none. So downstream
// mirrors upstream byte for byte and a fresh value is back the instant its gradient's last
// byte is up. The general rule is implemented all the same; it costs nothing and states the
// model as docs/ideal_model.md does.
class PriorityNetwork final : public FluidNetwork {
 public:
  explicit PriorityNetwork(size_t layers)
      : up_left_s_(layers, 0), backlog_s_(layers, 0), in_flight_(layers, false) {}

  void gradient_ready(size_t layer, double seconds) override {
    PSCHED_REQUIRE(!in_flight_[layer], layer);
    in_flight_[layer] = true;
    up_left_s_[layer] = seconds;
    backlog_s_[layer] = 0;
    uploading_.insert(layer);  // also for 0 s: it then ends, and comes back, at once
    busy_s_ += seconds;
  }

  double next_event(double now) const override {
    size_t h = head();
    size_t d = served_down();
    double up_at = h == kNone ? kNever : up_left_s_[h];
    double down_at = d == kNone || d == h ? kNever : backlog_s_[d];
    return now + std::min(up_at, down_at);
  }

  void advance(double dt) override {
    if (dt <= 0) return;
    size_t h = head();
    size_t d = served_down();
    if (h != kNone) {
      up_left_s_[h] = std::max(0.0, up_left_s_[h] - dt);
      if (d != h) {
        backlog_s_[h] += dt;
        backlogged_.insert(h);
      }
    }
    // A backlog overshooting zero by rounding stays in backlogged_ at 0: its event is due now.
    if (d != kNone && d != h) backlog_s_[d] = std::max(0.0, backlog_s_[d] - dt);
  }

  size_t handle_event() override {
    size_t h = head();
    size_t d = served_down();
    bool up_due = h != kNone && (d == h || d == kNone || up_left_s_[h] <= backlog_s_[d]);
    if (up_due) {
      up_left_s_[h] = 0;
      uploading_.erase(h);
      return backlog_s_[h] == 0 ? complete(h) : kNone;  // exact: a tracking h's backlog is 0
    }
    PSCHED_REQUIRE(d != kNone, h);
    backlog_s_[d] = 0;
    backlogged_.erase(d);
    return uploading_.contains(d) ? kNone : complete(d);
  }

 private:
  // The layer being sent up, or kNone.
  size_t head() const { return uploading_.empty() ? kNone : *uploading_.begin(); }

  // The layer being sent down (see the class comment), or kNone.
  size_t served_down() const {
    size_t h = head();
    size_t b = backlogged_.empty() ? kNone : *backlogged_.begin();
    return std::min(h, b);  // kNone is the largest size_t
  }

  size_t complete(size_t layer) {
    in_flight_[layer] = false;
    return layer;
  }

  std::vector<double> up_left_s_;  // per layer in flight
  std::vector<double> backlog_s_;  // per layer in flight; > 0 in backlogged_ until its event
  std::vector<bool> in_flight_;    // gradient ready, fresh value not yet fully back
  std::set<size_t> uploading_;     // layers with a gradient not fully sent up, lowest first
  std::set<size_t> backlogged_;    // layers with a backlog, lowest first
};

std::unique_ptr<FluidNetwork> make_network(FluidPolicy policy, size_t layers) {
  if (policy == FluidPolicy::fifo) return std::make_unique<FifoNetwork>(layers);
  return std::make_unique<PriorityNetwork>(layers);
}

// The event-driven simulation of `simulate_fluid`. Events: a compute task ends, or a network
// event (see the networks above). Between events all rates are constant. At one instant,
// network events are handled before the compute task's end (a gradient made ready at the same
// instant as another ends upstream must not preempt it with nothing left).
class FluidSimulation {
 public:
  FluidSimulation(const std::vector<FluidLayer>& layers, double rate, FluidPolicy policy,
                  int iterations)
      : layers_(layers),
        rate_(rate),
        iterations_(iterations),
        fresh_back_(layers.size(), 0),
        network_(make_network(policy, layers.size())) {}

  FluidResult run() {
    try_start_compute();
    while (step_once()) {
    }
    PSCHED_REQUIRE(finished_compute_, iteration_, step_, now_);  // a stall would be a bug
    FluidResult result;
    result.iteration_starts = starts_;
    result.upstream_busy_s = network_->upstream_busy_s();
    result.downstream_busy_s = network_->downstream_busy_s();
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
    double network_at = network_->next_event(now_);
    double at = std::min(compute_at, network_at);
    if (at == kNever) return false;
    network_->advance(at - now_);
    now_ = at;
    if (network_at == at) {
      size_t layer = network_->handle_event();
      if (layer != kNone) {
        ++fresh_back_[layer];
        try_start_compute();
      }
    } else {
      on_compute_done();
    }
    return true;
  }

  // The compute task at (iteration_, step_) has ended. Steps 0..L-1 are forwards of layers
  // 0..L-1; steps L..2L-1 are backwards of layers L-1..0.
  void on_compute_done() {
    compute_end_ = kNever;
    if (!is_forward(step_)) network_->gradient_ready(layer_of(step_), transfer_s(layer_of(step_)));
    if (++step_ == 2 * layer_count()) {
      step_ = 0;
      ++iteration_;
    }
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
  std::unique_ptr<FluidNetwork> network_;
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
