// SPDX-License-Identifier: Apache-2.0
#include "bench/apply_gpu.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/shard/variable.h"
#include "bench/apply_cpu.h"
#include "bench/measurement.h"
#include "config/byte_size.h"
#include "optim/gpu/cuda_check.h"
#include "optim/gpu/cuda_memory.h"
#include "optim/gpu/fused_apply.h"

// Per optimizer and variable size (float32):
//   cpu        Variable::take of the whole variable, split over the apply pool as
//              psched-server does
//   gpu shard  Variable::take on a `device: cuda:N` variable: the gradient through the pinned
//              staging ring to the GPU, the fused kernel, the fresh values back
//   gpu kernel the fused kernel alone on device-resident data (grad already on the GPU)
//   h2d, d2h   cudaMemcpyAsync between pinned host memory and the GPU, `size` bytes
//   d2d        a device-to-device copy of `size` bytes
// "grad GB/s" counts the gradient bytes applied per second (what the network feeds a shard);
// the kernel's "traffic GB/s" counts every byte it reads and writes (param, grad, state in;
// param, state out), comparable with d2d's traffic (read + write).
namespace psched::bench {
namespace {

using optim::gpu::check_cuda;
using optim::gpu::CudaStream;
using optim::gpu::DeviceMemory;
using optim::gpu::PinnedMemory;

struct Row {
  std::string optimizer;
  uint64_t bytes = 0;
  double cpu = 0, gpu_shard = 0, gpu_kernel = 0;  // grad GB/s
  double kernel_traffic = 0, h2d = 0, d2h = 0, d2d_traffic = 0;
};

// Seconds per call of `enqueue` (which enqueues work on `stream`), timed with CUDA events
// over enough calls to fill `budget` seconds (at least 3).
template <typename Enqueue>
double gpu_seconds(cudaStream_t stream, double budget, const Enqueue& enqueue) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "creating an event");
  check_cuda(cudaEventCreate(&stop), "creating an event");
  auto timed = [&](int calls) {
    check_cuda(cudaEventRecord(start, stream), "recording an event");
    for (int i = 0; i < calls; ++i) enqueue();
    check_cuda(cudaEventRecord(stop, stream), "recording an event");
    check_cuda(cudaEventSynchronize(stop), "timing on the GPU");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "reading an event");
    return ms / 1e3 / calls;
  };
  const double once = timed(1);  // also the warm-up
  const int calls = static_cast<int>(std::clamp(budget / std::max(once, 1e-7), 3.0, 2000.0));
  const double per_call = timed(calls);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return per_call;
}

double gb_per_s(uint64_t bytes, double seconds) {
  return double(bytes) / seconds / 1e9;
}

// grad GB/s of Variable::take of the whole variable, one step after the other (as its shard's
// step machine has it apply one async worker's pushes).
double push_gb_per_s(Variable& variable, std::span<const std::byte> grad, double seconds) {
  Step step;
  const ElementRange all = variable.part();
  Measurement m = time_iterations(Budget{seconds, 3, 1}, grad.size(), [&] {
    step = step.next();
    const StepUpdate update{.step = step, .t = step.value, .pieces = {{all, 0, true}}};
    variable.take(update, {.worker = WorkerId(0),
                           .variable = VariableId(0),
                           .step = step,
                           .range = all,
                           .dtype = variable.dtype(),
                           .data = grad});
  });
  return m.gb_per_s();
}

void measure_shard_paths(const GpuApplyOptions& o, const VariableSpec& spec, ForkJoinPool& pool,
                         optim::ComputeDevice& device, Row& row) {
  const uint64_t n = spec.elements();
  const std::vector<float> initial(n, 0.5f), grad(n, 1e-3f);
  const auto initial_bytes = std::as_bytes(std::span(initial));
  const auto grad_bytes = std::as_bytes(std::span(grad));
  {
    Variable cpu(spec, {0, n}, initial_bytes, &pool);
    row.cpu = push_gb_per_s(cpu, grad_bytes, o.seconds);
  }
  Variable gpu(spec, {0, n}, initial_bytes, nullptr, &device);
  row.gpu_shard = push_gb_per_s(gpu, grad_bytes, o.seconds);
}

void measure_kernel(const GpuApplyOptions& o, const VariableSpec& spec, cudaStream_t stream,
                    Row& row) {
  const uint64_t n = spec.elements(), bytes = n * sizeof(float);
  const int slots = optim::state_slots(spec.optimizer);
  DeviceMemory param(bytes), grad(bytes);
  std::vector<DeviceMemory> state;
  optim::gpu::DeviceRange<float> range{
      reinterpret_cast<float*>(param.data()), reinterpret_cast<const float*>(grad.data()), {}, n};
  for (int k = 0; k < slots; ++k) {
    state.emplace_back(bytes);
    range.state[k] = reinterpret_cast<float*>(state.back().data());
  }
  for (DeviceMemory* m : {&param, &grad}) check_cuda(cudaMemset(m->data(), 0, bytes), "clearing");
  for (DeviceMemory& m : state) check_cuda(cudaMemset(m.data(), 0, bytes), "clearing");
  uint64_t t = 0;
  const double s = gpu_seconds(
      stream, o.seconds, [&] { optim::gpu::enqueue_apply(spec.optimizer, range, ++t, 0, stream); });
  row.gpu_kernel = gb_per_s(bytes, s);
  row.kernel_traffic = gb_per_s(apply_traffic_bytes(spec), s);
}

void measure_copies(const GpuApplyOptions& o, uint64_t bytes, cudaStream_t stream, Row& row) {
  PinnedMemory host(bytes);
  DeviceMemory a(bytes), b(bytes);
  auto copy = [&](void* to, const void* from, cudaMemcpyKind kind) {
    return gpu_seconds(stream, o.seconds, [&] {
      check_cuda(cudaMemcpyAsync(to, from, bytes, kind, stream), "copying");
    });
  };
  row.h2d = gb_per_s(bytes, copy(a.data(), host.data(), cudaMemcpyHostToDevice));
  row.d2h = gb_per_s(bytes, copy(host.data(), a.data(), cudaMemcpyDeviceToHost));
  row.d2d_traffic = gb_per_s(2 * bytes, copy(b.data(), a.data(), cudaMemcpyDeviceToDevice));
}

void print_header(const GpuApplyOptions& o, const optim::ComputeDevice& device,
                  unsigned pool_width) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, static_cast<int>(o.device)), "reading properties");
  fmt::print("apply on the GPU: {} ({}), cpu apply on {} threads; float32; GB = 1e9 bytes\n",
             optim::to_string(device.spec()), prop.name, pool_width);
  fmt::print("{:>8} {:>8} | {:>8} {:>9} {:>10} | {:>11} {:>7} {:>7} {:>9} | {:>9} {:>11} {:>9}\n",
             "optim", "size", "cpu", "gpu shard", "gpu kernel", "kernel trfc", "h2d", "d2h",
             "d2d trfc", "shard/cpu", "kernel/d2d", "shard/h2d");
  fmt::print("{:>8} {:>8} | {:>8} {:>9} {:>10} | {:>11} {:>7} {:>7} {:>9} | {:>9} {:>11} {:>9}\n",
             "", "", "grad GB/s", "grad GB/s", "grad GB/s", "GB/s", "GB/s", "GB/s", "GB/s", "",
             "(traffic)", "");
}

void print_row(const Row& r) {
  fmt::print(
      "{:>8} {:>8} | {:>8.1f} {:>9.1f} {:>10.1f} | {:>11.1f} {:>7.1f} {:>7.1f} {:>9.1f} | "
      "{:>9.2f} {:>11.2f} {:>9.2f}\n",
      r.optimizer, format_byte_size(r.bytes), r.cpu, r.gpu_shard, r.gpu_kernel, r.kernel_traffic,
      r.h2d, r.d2h, r.d2d_traffic, r.gpu_shard / r.cpu, r.kernel_traffic / r.d2d_traffic,
      r.gpu_shard / r.h2d);
  std::fflush(stdout);
}

nlohmann::json to_json(const Row& r) {
  return {{"optimizer", r.optimizer},
          {"size_bytes", r.bytes},
          {"size", format_byte_size(r.bytes)},
          {"cpu_grad_gb_per_s", r.cpu},
          {"gpu_shard_grad_gb_per_s", r.gpu_shard},
          {"gpu_kernel_grad_gb_per_s", r.gpu_kernel},
          {"gpu_kernel_traffic_gb_per_s", r.kernel_traffic},
          {"h2d_gb_per_s", r.h2d},
          {"d2h_gb_per_s", r.d2h},
          {"d2d_traffic_gb_per_s", r.d2d_traffic}};
}

}  // namespace

int usable_gpu_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

nlohmann::json run_gpu_apply(const GpuApplyOptions& o, ForkJoinPool& pool) {
  auto device = optim::ComputeDevice::open({optim::DeviceSpec::Kind::cuda, o.device});
  check_cuda(cudaSetDevice(static_cast<int>(o.device)), "selecting the device");
  CudaStream stream;
  print_header(o, *device, pool.width());
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& optimizer : o.optimizers) {
    for (uint64_t bytes : o.sizes) {
      const VariableSpec spec = bench_variable_spec(optimizer, bytes / sizeof(float));
      Row row{.optimizer = optimizer, .bytes = bytes};
      measure_shard_paths(o, spec, pool, *device, row);
      check_cuda(cudaSetDevice(static_cast<int>(o.device)), "selecting the device");
      measure_kernel(o, spec, stream.get(), row);
      measure_copies(o, bytes, stream.get(), row);
      print_row(row);
      rows.push_back(to_json(row));
    }
  }
  return rows;
}

}  // namespace psched::bench
