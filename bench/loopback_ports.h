// SPDX-License-Identifier: Apache-2.0
// Loopback ports for a benchmark's shards, so that two runs on one machine (two clones' test
// suites, ctest -j) do not share one.
#pragma once

#include <cstdint>

namespace psched::bench {

// The first of `count` consecutive ports free on 127.0.0.1 now: a port the kernel picks (bound
// to port 0 and read back), picked again until the `count - 1` after it bind too. Another
// process may still take one before the shards bind; the benchmark then fails to start, naming
// the address. Throws std::runtime_error after 100 tries.
uint16_t free_loopback_ports(unsigned count);

}  // namespace psched::bench
