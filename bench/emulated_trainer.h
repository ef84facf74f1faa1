// SPDX-License-Identifier: Apache-2.0
// An emulated trainer: runs a model profile's iterations against real shards. Compute is
// emulated by sleeping for each layer's forward and backward time (the CPU stays free for the
// communication threads; sleeping overshoots by tens of microseconds per layer). Gradients
// are real bytes of the profile's sizes; layer i's forward of iteration k waits for layer i's
// fresh values of iteration k-1, as a real trainer's would.
#pragma once

#include <atomic>
#include <chrono>
#include <vector>

#include "bench/model_profile.h"
#include "client/client.h"

namespace psched::bench {

using Clock = std::chrono::steady_clock;

class EmulatedTrainer {
 public:
  // Registers every tensor of `profile` (priority = layer index) on `client`, which outlives
  // the trainer.
  EmulatedTrainer(Client& client, const ModelProfile& profile);

  // Runs iterations 1..iterations and waits for the last one's fresh values; returns each
  // iteration's start, in seconds since `epoch`.
  std::vector<double> run(int iterations, Clock::time_point epoch);
  // Iterations started so far by run() (any thread: for a progress display).
  int started_iterations() const { return started_.load(std::memory_order_relaxed); }

 private:
  struct Tensor {
    VariableHandle handle;
    std::vector<float> value;     // fresh values land here
    std::vector<float> gradient;  // what backward "produces"
  };
  void forward(size_t layer, Step previous);  // waits for step `previous`'s fresh values first
  void backward(size_t layer, Step step);     // then pushes the layer's gradients of `step`
  static void compute(double seconds);

  Client& client_;
  const ModelProfile& profile_;
  std::vector<std::vector<Tensor>> tensors_;  // per layer
  std::atomic<int> started_{0};
};

// Median of the iteration durations after the first `warmup` iterations (there must be at
// least one such duration: warmup + 2 starts).
double steady_iteration_s(const std::vector<double>& starts, int warmup);

}  // namespace psched::bench
