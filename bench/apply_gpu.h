// SPDX-License-Identifier: Apache-2.0
// The GPU half of psched-apply-bench (built only with CUDA: PSCHED_HAVE_CUDA): the shard's
// apply on a `device: cuda:N` variable and the fused kernel alone, against the GPU's own copy
// bandwidths measured in the same run (docs/gpu.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/fork_join_pool.h"

namespace psched::bench {

struct GpuApplyOptions {
  std::vector<std::string> optimizers{"adam", "sgd"};
  std::vector<uint64_t> sizes;  // variable sizes in bytes, multiples of 4 (float32)
  double seconds = 0.2;         // per figure
  uint32_t device = 0;          // CUDA device number
};

// The number of CUDA devices this process can use; 0 when there are none or no driver.
int usable_gpu_count();

// Measures and prints the GPU table, one row per optimizer and size; its `cpu` column applies
// on `pool` as psched-server does. Returns the rows for --json. Throws psched::Error when the
// device cannot be used.
nlohmann::json run_gpu_apply(const GpuApplyOptions& options, ForkJoinPool& pool);

}  // namespace psched::bench
