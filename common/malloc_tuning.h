// SPDX-License-Identifier: Apache-2.0
// Keeps glibc malloc from handing multi-megabyte message buffers back to the kernel after each
// message. Cap'n Proto allocates every received message afresh; by default glibc serves large
// ones with mmap (or trims the heap after they are freed), so each message pays page faults on
// every page, which on our VMs cost up to 5x throughput (measured: 4 MiB partitions pipelined
// 0.14 -> 0.78 of raw TCP with this tuning; bench/transport_bench).
#pragma once

namespace psched {

// Serves allocations up to 32 MiB from the heap and keeps up to 1 GiB of freed heap memory for
// reuse. Process-wide; idempotent. psched-server and the Client call it.
void tune_malloc_for_large_messages();

}  // namespace psched
