// SPDX-License-Identifier: Apache-2.0
// The fused CUDA kernels against the CPU kernels (optim::apply) on random data, under the CPU
// kernels' own tolerance rule (reference_check.h): every optimizer option combination, float
// and double, odd sizes, 5 steps (the variance updated throughout, or frozen after
// kFreezeAfter), each step's gradient pushed in uneven pieces. Staging
// buffers of 64 KiB make the larger sizes run through the pinned ring several times.
#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <vector>

#include "optim/device.h"
#include "optim/reference_check.h"

namespace psched::optim::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;

template <typename T>
std::span<const std::byte> bytes_of(std::span<const T> values) {
  return std::as_bytes(values);
}

// The device variable's value, as the pieces' fresh values wrote it, and state slots.
template <typename T>
struct DeviceCopy {
  std::vector<T> param;
  std::vector<std::vector<T>> state;
};

// Applies `grad` to `variable` in three uneven pieces; the fresh values land in `param`.
template <typename T>
void apply_in_pieces(DeviceVariable& variable, const std::vector<T>& grad, uint64_t t,
                     uint64_t frozen_after, std::vector<T>& param) {
  const size_t n = grad.size(), cuts[] = {0, n / 3, n / 3 + n / 5, n};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const size_t begin = cuts[i], count = cuts[i + 1] - begin;
    if (count == 0) continue;
    variable.apply(begin, bytes_of(std::span<const T>(grad).subspan(begin, count)), t, frozen_after,
                   std::as_writable_bytes(std::span<T>(param).subspan(begin, count)));
  }
}

template <typename T>
std::vector<T> read_slot(const DeviceVariable& variable, int slot, size_t size) {
  std::vector<T> out(size);
  variable.read_state(slot, 0, std::as_writable_bytes(std::span<T>(out)));
  return out;
}

template <typename T>
void check_against_cpu(ComputeDevice& device, const OptimizerSpec& spec, size_t size, uint32_t seed,
                       uint64_t freeze_after) {
  std::mt19937 rng(seed);
  const std::vector<T> initial = random_values<T>(rng, size, 1.0);
  KernelVariable<T> cpu(spec, initial);
  const DType dtype = std::is_same_v<T, float> ? DType::float32 : DType::float64;
  auto gpu = device.allocate(spec, dtype, bytes_of(std::span<const T>(initial)));
  std::vector<T> gpu_param(size);
  for (uint64_t t = 1; t <= kGradScales.size(); ++t) {
    CAPTURE(t);
    const std::vector<T> grad = random_values<T>(rng, size, kGradScales[t - 1]);
    const uint64_t frozen = frozen_at(t, freeze_after);
    cpu.step(spec, grad, t, frozen);
    apply_in_pieces(*gpu, grad, t, frozen, gpu_param);
    const Tolerance tol = same_arithmetic_tolerance<T>();
    check_close(
        "param", gpu_param, [&](size_t i) { return double(cpu.param[i]); }, tol);
    for (int k = 0; k < state_slots(spec); ++k) {
      CAPTURE(k);
      const std::vector<T> slot = read_slot<T>(*gpu, k, size);
      check_close(
          "state", slot, [&](size_t i) { return double(cpu.state[k][i]); }, tol);
    }
  }
}

TEST_CASE_TEMPLATE("every optimizer on the GPU matches the CPU kernel on random data", T, float,
                   double) {
  auto device = ComputeDevice::open({DeviceSpec::Kind::cuda, 0}, kStagingBytes);
  for (const NamedSpec& named : all_option_combinations()) {
    CAPTURE(named.name);
    for (size_t size : kOddSizes)
      for (uint64_t freeze_after : {uint64_t(0), kFreezeAfter})
        check_against_cpu<T>(*device, named.spec, size, static_cast<uint32_t>(2000 + size),
                             freeze_after);
  }
}

TEST_CASE("a GPU variable's optimizer state starts at the optimizer's initial value") {
  auto device = ComputeDevice::open({DeviceSpec::Kind::cuda, 0}, kStagingBytes);
  const OptimizerSpec spec = specs::adagrad_decay();  // accumulator starts at 0.1, not 0
  const std::vector<double> initial{1, 2, 3};
  auto gpu = device->allocate(spec, DType::float64, bytes_of(std::span<const double>(initial)));
  CHECK(read_slot<double>(*gpu, 0, 3) == std::vector<double>(3, 0.1));
  CHECK(device->spec() == DeviceSpec{DeviceSpec::Kind::cuda, 0});
}

}  // namespace
}  // namespace psched::optim::testing
