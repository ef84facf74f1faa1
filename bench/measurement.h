// SPDX-License-Identifier: Apache-2.0
// Timing for the transport benchmark: run an iteration repeatedly for a time budget and keep
// each iteration's wall time (steady clock), so throughput and latency percentiles come from
// the same samples.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include <sys/resource.h>

namespace psched::bench {

// How long to measure one case.
struct Budget {
  double seconds = 1.0;         // stop starting iterations after this much wall time ...
  uint64_t min_iterations = 5;  // ... but not before this many timed iterations ran
  uint64_t warmup = 2;          // untimed iterations first (first-touch allocations, slow start)
};

// The figures of one case. Bytes are counted in one direction (what the client sends).
struct Measurement {
  uint64_t bytes_per_iteration = 0;
  uint64_t iterations = 0;
  double seconds = 0;                // wall time of the timed iterations together
  std::vector<double> iteration_us;  // per-iteration wall time; empty when not recorded
  // CPU time of the whole process (user + system, every thread: both ends of the connection
  // live in it) while the timed iterations ran. Unlike wall time it barely depends on what
  // else the machine runs.
  double cpu_seconds = 0;
  // The context switches of the whole process in that time: each a thread that slept and was
  // woken, or was preempted. What a hand-off between threads costs beyond its CPU time.
  uint64_t context_switches = 0;

  double gb_per_s() const { return double(bytes_per_iteration) * iterations / seconds / 1e9; }
  double iterations_per_s() const { return iterations / seconds; }
  // CPU seconds per 1e9 bytes counted one way.
  double cpu_s_per_gb() const {
    return cpu_seconds / (double(bytes_per_iteration) * iterations / 1e9);
  }
  // Context switches per request of `request_bytes` (counted one way).
  double switches_per_request(uint64_t request_bytes) const {
    return double(context_switches) /
           (double(bytes_per_iteration) * iterations / double(request_bytes));
  }
  // The q-quantile (0..1, nearest rank) of iteration_us; 0 when none were recorded.
  double percentile_us(double q) const {
    if (iteration_us.empty()) return 0;
    std::vector<double> sorted = iteration_us;
    std::sort(sorted.begin(), sorted.end());
    size_t rank = size_t(std::ceil(q * sorted.size()));
    return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
  }
};

using BenchClock = std::chrono::steady_clock;

// What this process has used so far, all threads together.
struct ProcessUsage {
  double cpu_seconds = 0;         // user + system
  uint64_t context_switches = 0;  // voluntary + involuntary

  static ProcessUsage now() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto seconds = [](timeval t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
    return {seconds(usage.ru_utime) + seconds(usage.ru_stime),
            uint64_t(usage.ru_nvcsw) + uint64_t(usage.ru_nivcsw)};
  }
  // Sets m's cpu_seconds and context_switches to what was used since `this` was taken.
  void record_since(Measurement& m) const {
    const ProcessUsage end = now();
    m.cpu_seconds = end.cpu_seconds - cpu_seconds;
    m.context_switches = end.context_switches - context_switches;
  }
};

inline double seconds_between(BenchClock::time_point a, BenchClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// True once the budget allows no further iteration to start.
inline bool budget_spent(const Budget& budget, uint64_t done, BenchClock::time_point start) {
  return done >= budget.min_iterations &&
         seconds_between(start, BenchClock::now()) >= budget.seconds;
}

// Runs `iteration()` budget.warmup times untimed, then timed until the budget is spent.
template <typename Iteration>
Measurement time_iterations(const Budget& budget, uint64_t bytes_per_iteration,
                            Iteration&& iteration) {
  for (uint64_t i = 0; i < budget.warmup; ++i) iteration();
  Measurement m;
  m.bytes_per_iteration = bytes_per_iteration;
  const ProcessUsage usage = ProcessUsage::now();
  const auto start = BenchClock::now();
  for (auto before = start; !budget_spent(budget, m.iterations, start); ++m.iterations) {
    iteration();
    const auto after = BenchClock::now();
    m.iteration_us.push_back(seconds_between(before, after) * 1e6);
    before = after;
  }
  m.seconds = seconds_between(start, BenchClock::now());
  usage.record_since(m);
  return m;
}

// Runs `measure(i)` for i in [0, n) on a thread each, all at once; returns each one's figures
// (rethrows the first failure, after all have ended).
template <typename Measure>
std::vector<Measurement> measure_at_once(unsigned n, Measure measure) {
  std::vector<Measurement> each(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        each[i] = measure(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return each;
}

}  // namespace psched::bench
