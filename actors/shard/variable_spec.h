// SPDX-License-Identifier: Apache-2.0
// What a worker registers: a named tensor, its element type, priority and optimizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/types.h"
#include "optim/optimizer.h"

namespace psched {

struct VariableSpec {
  std::string name;
  std::vector<uint64_t> shape;  // empty: a scalar
  DType dtype = DType::float32;
  Priority priority;  // lower is more urgent
  optim::OptimizerSpec optimizer;

  uint64_t elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return elements() * element_bytes(dtype); }

  // Same variable for registration purposes: priority is a scheduling hint and may differ
  // between workers; the first registration's priority stays.
  bool same_variable(const VariableSpec& o) const {
    return name == o.name && shape == o.shape && dtype == o.dtype && optimizer == o.optimizer;
  }
};

}  // namespace psched
