// SPDX-License-Identifier: Apache-2.0
// What the variable tests share (shard_actors_test, gpu_test): a plain SGD spec, a variable's
// value as floats, and the code of the psched::Error a call throws.
#pragma once

#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include "actors/shard/variable.h"
#include "common/error.h"

namespace psched::testing {

// Variable "w" of `n` elements under plain SGD.
inline VariableSpec sgd_spec(uint64_t n, double lr = 1.0) {
  VariableSpec spec;
  spec.name = "w";
  spec.shape = {n};
  spec.optimizer.kind = optim::OptimizerKind::sgd;
  spec.optimizer.lr = lr;
  return spec;
}

inline std::vector<float> value_of(const Variable& v) {
  std::vector<float> out(v.part().size());
  v.read(v.part(), reinterpret_cast<std::byte*>(out.data()));
  return out;
}

// The code of the psched::Error `f()` throws; fails the test when it throws none.
inline ErrorCode code_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no psched::Error thrown");
  return ErrorCode::internal;
}

}  // namespace psched::testing
