// SPDX-License-Identifier: Apache-2.0
// What the in-process benchmarks of a data structure read: the heap glibc reports in use, and
// seconds on the steady clock.
#pragma once

#include <malloc.h>

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

}  // namespace psched::bench
