// SPDX-License-Identifier: Apache-2.0
// The CPU half of psched-apply-bench: a shard's optimizer apply on the CPU (Variable::push, the
// path psched-server takes) against a memory copy of the same bytes, timed in the same run,
// in alternating blocks, so that the ratio holds on a shared, noisy machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "actors/shard/variable_spec.h"
#include "common/fork_join_pool.h"

namespace psched::bench {

// A float32 variable of `elements` elements named "bench/w" with optimizer `optimizer` (a
// name parse_optimizer_kind reads) at its defaults, lr 1e-3, momentum 0.9 for `momentum` and
// weight decay 0.01 for `adamw`. Throws on an unknown name.
VariableSpec bench_variable_spec(const std::string& optimizer, uint64_t elements);

// Bytes one apply of `spec` reads and writes: param, grad and every state slot read; param and
// every state slot written.
uint64_t apply_traffic_bytes(const VariableSpec& spec);

struct CpuApplyOptions {
  double seconds = 0.2;  // wall time per figure, spread over `rounds` blocks
  int rounds = 3;        // blocks per figure, alternating apply and copy
};

// One way of moving a row's bytes, timed.
struct Rate {
  double gb_per_s = 0;      // traffic bytes (read + written) per wall second, GB = 1e9 bytes
  double cpu_per_wall = 0;  // CPU seconds of the process (all threads) per wall second
  uint64_t iterations = 0;  // timed applies or copies
};

// The apply and the baselines moving as many bytes, on the same threads.
struct ApplyAndCopies {
  Rate apply;
  Rate memcpy;     // std::memcpy of traffic_bytes / 2 bytes
  Rate streaming;  // the same with non-temporal stores (memcpy where the target has none)
  Rate pattern;    // the apply's arrays read and written in place, one addition per element

  // The copy baseline: the faster copy's GB/s.
  double copy_gb_per_s() const;
};

// One optimizer at one variable size.
struct CpuApplyRow {
  std::string optimizer;
  uint64_t bytes = 0;          // the variable's size
  uint64_t traffic_bytes = 0;  // per apply, apply_traffic_bytes(); each copy moves as many
  ApplyAndCopies one;          // on the calling thread
  unsigned pool_threads = 1;   // threads of the pooled figures (1: too small to split)
  ApplyAndCopies pool;         // split over the apply pool as psched-server does
};

// Measures one row: pushes of the whole variable to a Variable without and with `pool`, and
// the baselines (copies of traffic_bytes / 2 bytes from one buffer to another, so read +
// written bytes equal the apply's; the apply's access pattern without its arithmetic), in
// alternating blocks, on one thread and split like the apply over the pool.
CpuApplyRow measure_cpu_apply(const CpuApplyOptions& options, const std::string& optimizer,
                              uint64_t bytes, ForkJoinPool& pool);

void print_cpu_header(unsigned pool_width);
void print_cpu_row(const CpuApplyRow& row);
nlohmann::json to_json(const ApplyAndCopies& figures);
nlohmann::json to_json(const CpuApplyRow& row);

}  // namespace psched::bench
