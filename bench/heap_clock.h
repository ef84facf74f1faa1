// SPDX-License-Identifier: Apache-2.0
// What the in-process benchmarks of a data structure read: the heap glibc reports in use,
// seconds on the steady clock, and the CPU seconds of the calling thread.
#pragma once

#include <malloc.h>
#include <time.h>

#include <chrono>
#include <cstddef>

namespace psched::bench {

using Clock = std::chrono::steady_clock;

// Bytes in use on the heap: small blocks and mmapped ones.
inline size_t heap_bytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds the calling thread has run on a core, user and system (CLOCK_THREAD_CPUTIME_ID): what
// one thread's work costs where other processes share the cores, whose turns a wall clock
// counts too. Memory stalls count: the thread holds its core while it waits.
inline double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

}  // namespace psched::bench
