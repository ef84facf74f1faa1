// SPDX-License-Identifier: Apache-2.0
// CPU time of this process's threads by role, read from /proc/self/task: psched names its
// threads (psched-client: a worker's loop; psched-shard: a shard's loop; psched-apply: the
// shards' apply pool), so a benchmark that runs workers and shards in one process can still
// say what each side spent.
#pragma once

#include <map>
#include <string>

namespace psched::bench {

// User + system CPU seconds of the live threads, summed per role: psched-client, psched-shard,
// psched-apply, and "other" (the benchmark's own threads). Threads that already exited are not
// counted: take both readings while the measured threads live.
std::map<std::string, double> thread_cpu_seconds();

}  // namespace psched::bench
