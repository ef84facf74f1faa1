// SPDX-License-Identifier: Apache-2.0
// Variable::read_state and write_state on the CPU path (the GPU path: variable_gpu_test.cc), the
// variable taking updates as its step machine hands them.
#include <doctest/doctest.h>

#include <vector>

#include "actors/shard/variable.h"

namespace psched {
namespace {

// What the step machine hands a variable for worker 0's async update `t` of `range`.
StepUpdate update(uint64_t t, ElementRange range) {
  return {.step = Step(t), .t = t, .pieces = {{range, 0, true}}};
}

// Worker 0's push of `grad` (doubles) into `range` at step `t`.
Push push(uint64_t t, ElementRange range, const std::vector<double>& grad) {
  return {WorkerId(0), VariableId(0),  Step(t),
          range,       DType::float64, std::as_bytes(std::span(grad))};
}

TEST_CASE("read_state copies a range of an optimizer state slot after updates") {
  const VariableSpec spec{
      .name = "w",
      .shape = {6},
      .dtype = DType::float64,
      .priority = Priority(0),
      .optimizer = {.kind = optim::OptimizerKind::momentum, .lr = 0.5, .momentum = 0.9}};
  const std::vector<double> initial(4, 1.0), grad{1, 2, 3, 4};
  Variable v(spec, {2, 6}, std::as_bytes(std::span(initial)));
  v.take(update(1, {2, 6}), push(1, {2, 6}, grad));
  std::vector<double> buffer(2);
  v.read_state(0, {3, 5}, reinterpret_cast<std::byte*>(buffer.data()));
  CHECK(buffer == std::vector<double>{2, 3});  // torch: the first step's buffer is the gradient
}

TEST_CASE("write_state overwrites a range of a slot, and the next update starts from it") {
  const VariableSpec spec{
      .name = "w",
      .shape = {2},
      .dtype = DType::float64,
      .priority = Priority(0),
      .optimizer = {.kind = optim::OptimizerKind::momentum, .lr = 1, .momentum = 0.5}};
  const std::vector<double> initial{0, 0}, grad{1, 1}, restored{4, 8};
  Variable v(spec, {0, 2}, std::as_bytes(std::span(initial)));
  v.take(update(1, {0, 2}), push(1, {0, 2}, grad));
  v.write_state(0, {0, 2}, reinterpret_cast<const std::byte*>(restored.data()));
  v.take(update(2, {0, 2}), push(2, {0, 2}, grad));
  std::vector<double> buffer(2);
  v.read_state(0, {0, 2}, reinterpret_cast<std::byte*>(buffer.data()));
  CHECK(buffer == std::vector<double>{0.5 * 4 + 1, 0.5 * 8 + 1});
}

}  // namespace
}  // namespace psched
