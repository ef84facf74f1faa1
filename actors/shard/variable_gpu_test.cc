// SPDX-License-Identifier: Apache-2.0
// Variables on a GPU against the same variables on the CPU: two workers push each step in
// partitions, async and sync, and polls would read the same values; the optimizer state on
// the device matches too (the CPU kernels' tolerance rule, reference_check.h).
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "actors/shard/variable.h"
#include "actors/shard/variable_test_support.h"
#include "optim/device.h"
#include "optim/reference_check.h"

namespace psched {
namespace {

using optim::testing::check_close;
using optim::testing::random_values;
using optim::testing::same_arithmetic_tolerance;
using testing::Tracked;
using testing::value_of;

constexpr size_t kStagingBytes = 64 << 10;
constexpr uint64_t kPartition = 12345;  // elements; not a divisor of the part

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

std::vector<float> state_of(const Variable& v, int slot) {
  std::vector<float> out(v.part().size());
  v.read_state(slot, v.part(), reinterpret_cast<std::byte*>(out.data()));
  return out;
}

void check_same(const Variable& gpu, const Variable& cpu) {
  const auto tol = same_arithmetic_tolerance<float>();
  const std::vector<float> cpu_value = value_of(cpu);
  check_close(
      "value", value_of(gpu), [&](size_t i) { return double(cpu_value[i]); }, tol);
  for (int k = 0; k < optim::state_slots(cpu.spec().optimizer); ++k) {
    CAPTURE(k);
    const std::vector<float> cpu_state = state_of(cpu, k);
    check_close(
        "state", state_of(gpu, k), [&](size_t i) { return double(cpu_state[i]); }, tol);
  }
}

TEST_CASE("a variable on the GPU applies pushes as one on the CPU does, async and sync") {
  auto device = optim::ComputeDevice::open({optim::DeviceSpec::Kind::cuda, 0}, kStagingBytes);
  const VariableSpec spec{.name = "fc/w",
                          .shape = {60000},
                          .dtype = DType::float32,
                          .priority = Priority(0),
                          .optimizer = optim::testing::specs::adam_amsgrad_weight_decay()};
  const ElementRange part{7000, 57000};
  std::mt19937 rng(7);
  const std::vector<float> initial = random_values<float>(rng, part.size(), 1.0);
  for (Mode mode : {Mode::async, Mode::sync}) {
    CAPTURE(mode == Mode::sync);
    Tracked cpu(spec, part, bytes_of(initial), mode, 2);
    Tracked gpu(spec, part, bytes_of(initial), mode, 2, nullptr, device.get());
    for (uint64_t s = 1; s <= 3; ++s) {
      const Step step(s);
      for (uint32_t worker = 0; worker < 2; ++worker) {
        for (uint64_t begin = part.begin; begin < part.end; begin += kPartition) {
          const ElementRange range{begin, std::min(part.end, begin + kPartition)};
          const std::vector<float> grad = random_values<float>(rng, range.size(), 1.0);
          auto cpu_applied =
              cpu.push(WorkerId(worker), step, range, spec.dtype, bytes_of(grad)).applied;
          auto gpu_applied =
              gpu.push(WorkerId(worker), step, range, spec.dtype, bytes_of(grad)).applied;
          CHECK(gpu_applied == cpu_applied);
        }
      }
      CAPTURE(s);
      check_same(gpu.variable, cpu.variable);
    }
  }
}

TEST_CASE("optimizer state written to a GPU variable reads back the same and is updated there") {
  auto device = optim::ComputeDevice::open({optim::DeviceSpec::Kind::cuda, 0}, kStagingBytes);
  const VariableSpec spec{.name = "b",
                          .shape = {3000},
                          .dtype = DType::float32,
                          .priority = Priority(0),
                          .optimizer = optim::testing::specs::rmsprop_centered_momentum()};
  std::mt19937 rng(11);
  const std::vector<float> initial = random_values<float>(rng, 3000, 1.0);
  Tracked cpu(spec, {0, 3000}, bytes_of(initial), Mode::async, 1);
  Tracked gpu(spec, {0, 3000}, bytes_of(initial), Mode::async, 1, nullptr, device.get());
  for (int k = 0; k < optim::state_slots(spec.optimizer); ++k) {
    const std::vector<float> restored = random_values<float>(rng, 3000, 0.1);
    std::vector<float> square = restored;  // square_avg (slot 0) must stay >= grad_avg^2
    for (float& x : square) x = 1 + x * x;
    const auto& slot = k == 0 ? square : restored;
    cpu.variable.write_state(k, {0, 3000}, reinterpret_cast<const std::byte*>(slot.data()));
    gpu.variable.write_state(k, {0, 3000}, reinterpret_cast<const std::byte*>(slot.data()));
    CHECK(state_of(gpu.variable, k) == slot);
  }
  const std::vector<float> grad = random_values<float>(rng, 3000, 1.0);
  cpu.push(WorkerId(0), Step(1), {0, 3000}, spec.dtype, bytes_of(grad));
  gpu.push(WorkerId(0), Step(1), {0, 3000}, spec.dtype, bytes_of(grad));
  check_same(gpu.variable, cpu.variable);
}

TEST_CASE("a GPU variable's checkpoint restores onto the GPU and onto the CPU alike") {
  auto device = optim::ComputeDevice::open({optim::DeviceSpec::Kind::cuda, 0}, kStagingBytes);
  const VariableSpec spec{.name = "w",
                          .shape = {5000},
                          .dtype = DType::float32,
                          .priority = Priority(0),
                          .optimizer = optim::testing::specs::adam_amsgrad_weight_decay()};
  std::mt19937 rng(13);
  const std::vector<float> initial = random_values<float>(rng, 5000, 1.0);
  Tracked gpu(spec, {0, 5000}, bytes_of(initial), Mode::async, 1, nullptr, device.get());
  gpu.push(WorkerId(0), Step(1), {0, 5000}, spec.dtype,
           bytes_of(random_values<float>(rng, 5000, 1.0)));
  ByteWriter out;
  gpu.save(out);
  ByteReader on_gpu_bytes(out.bytes(), "gpu"), on_cpu_bytes(out.bytes(), "cpu");
  Tracked on_gpu = Tracked::restore(on_gpu_bytes, Mode::async, 1, nullptr, device.get());
  Tracked on_cpu = Tracked::restore(on_cpu_bytes, Mode::async, 1);
  const std::vector<float> grad = random_values<float>(rng, 5000, 1.0);
  for (Tracked* v : {&gpu, &on_gpu, &on_cpu})
    v->push(WorkerId(0), Step(2), {0, 5000}, spec.dtype, bytes_of(grad));
  check_same(on_gpu.variable, gpu.variable);
  check_same(gpu.variable, on_cpu.variable);
}

}  // namespace
}  // namespace psched
