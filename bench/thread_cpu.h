// SPDX-License-Identifier: Apache-2.0
// CPU time of this process's threads by role, read from /proc/self/task: psched names its
// threads (psched-client: a worker's loop; psched-shard: a shard's loop; psched-apply: the
// shards' apply pool), so a benchmark that runs workers and shards in one process can still
// say what each side spent.
#pragma once

#include <map>
#include <string>

namespace psched::bench {

// CPU seconds (each thread's scheduler runtime, ns resolution) of the live threads in each of
// the roles psched-client, psched-shard and psched-apply; every role is present (0 without a
// thread). Threads that already exited are not counted: take both readings while the measured
// threads live, and count the rest of the process's CPU (the benchmark's own threads, live or
// gone) as "other".
std::map<std::string, double> thread_cpu_seconds();

}  // namespace psched::bench
