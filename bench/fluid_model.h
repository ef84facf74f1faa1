// SPDX-License-Identifier: Apache-2.0
// The scheduling benchmark's reference figures (docs/design.md section 10, "Scheduling"): one
// iteration of a layer profile through a fluid model of the worker's link, computed exactly by
// an event-driven simulation. `FluidPolicy::priority` is the **ideal**, the limit of
// partitioned strict priority as partitions get infinitely fine (preemption at any byte, each
// byte back down as soon as it is up, no per-message cost); `FluidPolicy::fifo` models an
// unpartitioned first-come-first-served baseline (whole tensors), a sanity check for the
// measured fifo run, not an ideal. docs/ideal_model.md states the model, its
// assumptions and a worked example.
#pragma once

#include <vector>

namespace psched::bench {

// One layer of a model profile. Layers are listed in forward order: index 0 is the layer
// nearest the input, whose fresh value the next forward needs first.
struct FluidLayer {
  double forward_s = 0;   // compute seconds of this layer's forward, >= 0
  double backward_s = 0;  // compute seconds of this layer's backward, >= 0
  double bytes = 0;       // bytes of its gradient (sum of its parameter tensors), >= 0; the
                          // fresh value coming back has the same size
};

// How the link chooses what to send.
enum class FluidPolicy {
  // The ideal, the fluid limit of partitioned priority. Upstream: at every instant the whole
  // rate goes to the pending gradient of the lowest layer index; a newly ready one of a lower
  // index preempts at once (fluid, no cost). Downstream: each byte of a gradient may come back
  // as soon as it has gone up; strict priority by layer index, work-conserving, a layer with
  // nothing sent up but not yet down getting at most its upstream rate. With one rate both
  // ways this makes the downstream follow the upstream byte for byte: a fresh value is back
  // the instant its gradient's last byte is up.
  priority,
  // Not an ideal: whole tensors, store and forward. Pending tensors are sent whole, one at a
  // time, in the order they became ready (first come, first served; no preemption), and a
  // fresh value is ready for downstream only when its whole gradient is up.
  fifo,
};

// What `simulate_fluid` computed. Times are seconds from the start of iteration 1.
struct FluidResult {
  // Steady-state iteration time: the median of the durations of iterations 3..N (the first
  // two are warm-up: iteration 1 waits for no fresh value); for an even count, the mean of
  // the two middle durations.
  double iteration_s = 0;
  // Compute-only time: the sum of every layer's forward_s + backward_s, i.e. the iteration
  // time over an infinitely fast link.
  double compute_s = 0;
  // N + 1 entries. iteration_starts[k] (k < N) is when iteration k + 1's first forward
  // started; iteration_starts[N] is when iteration N + 1 could have started (its backward done
  // and layer 0's fresh value back), which ends iteration N. Durations are the differences.
  std::vector<double> iteration_starts;
  // Seconds each link direction spent sending, over the whole run (N iterations' tensors);
  // with a fluid link this is N * (sum of bytes) / rate for both.
  double upstream_busy_s = 0;
  double downstream_busy_s = 0;
  // When the last fresh value of iteration N arrived back (or its last compute ended, if
  // later): the end of the simulation.
  double finish_s = 0;
};

// Simulates `iterations` iterations of one worker training `layers` over a full-duplex link of
// `link_bytes_per_s` in each direction, under `policy`, and returns the timeline's figures.
//
// The model (docs/ideal_model.md): compute is strictly sequential, forward 0..L-1 then
// backward L-1..0. A layer's gradient is ready for upstream when its backward ends. The server
// costs nothing (no apply time, no latency, no per-message cost): under `priority` each byte
// sent up is at once ready to come back; under `fifo` the fresh value is ready once the whole
// gradient is up. Layer i's forward in iteration k > 1 also waits for all of layer i's fresh
// value of iteration k - 1.
//
// Preconditions (checked, std::logic_error): `layers` is not empty; every time and byte count
// is finite and >= 0; `link_bytes_per_s` > 0 (infinity allowed: every transfer then takes no
// time); `iterations` >= 3. Deterministic; O(L log L) per iteration.
FluidResult simulate_fluid(const std::vector<FluidLayer>& layers, double link_bytes_per_s,
                           FluidPolicy policy, int iterations = 10);

// The sum of every layer's forward_s + backward_s.
double compute_only_s(const std::vector<FluidLayer>& layers);

// The "balanced" link rate, in bytes/s: the rate at which sending every gradient once
// (sum of bytes / rate) takes exactly the compute-only time. The benchmark's default
// bandwidth. Requires a compute-only time > 0; 0 when the profile has no bytes.
double balanced_link_rate(const std::vector<FluidLayer>& layers);

// "priority" or "fifo".
const char* to_string(FluidPolicy policy);

}  // namespace psched::bench
