// SPDX-License-Identifier: Apache-2.0
// ComputeDevice for CUDA GPUs (built only with CUDA support): variables in device memory,
// partitions pipelined through a ring of pinned staging buffers on a few streams.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "optim/device.h"
#include "optim/gpu/cuda_check.h"
#include "optim/gpu/cuda_memory.h"
#include "optim/gpu/fused_apply.h"

namespace psched::optim {
namespace gpu {
namespace {

// Device pointer to element `index` of `memory`, viewed as T.
template <typename T>
T* element(const DeviceMemory& memory, uint64_t index) {
  return reinterpret_cast<T*>(memory.data()) + index;
}

// Called per piece of a partition: enqueue the update of `count` elements starting at element
// `first` of the variable part, reading the gradient from `device_grad`, on `stream`.
using EnqueuePiece =
    std::function<void(uint64_t first, uint64_t count, const std::byte* device_grad, Stream)>;

class CudaDevice final : public ComputeDevice {
 public:
  CudaDevice(uint32_t ordinal, size_t staging_bytes);
  ~CudaDevice() override { cudaSetDevice(static_cast<int>(ordinal_)); }  // before the frees
  DeviceSpec spec() const override { return {DeviceSpec::Kind::cuda, ordinal_}; }
  std::unique_ptr<DeviceVariable> allocate(const OptimizerSpec& optimizer, DType dtype,
                                           std::span<const std::byte> initial) override;

  // CUDA's current device is per thread, and a thread may serve more than one shard:
  // every entry point makes this device current first.
  void make_current() const;
  // Moves `grad` to the device piece by piece through the staging ring, calls `enqueue` per
  // piece, and copies the piece's fresh values (`element_bytes` each, from `device_value`,
  // which points at the first element `enqueue` is given) back into `fresh`. Returns when all
  // pieces are done. A piece's host copies overlap the other pieces' transfers and kernels.
  void pipeline(std::span<const std::byte> grad, size_t element_bytes,
                const std::byte* device_value, std::span<std::byte> fresh,
                const EnqueuePiece& enqueue);

 private:
  // One staging buffer and its stream. `fresh` is where the staged fresh values go once the
  // stream is done (empty: nothing pending).
  struct Slot {
    CudaStream stream;
    PinnedMemory staging;
    DeviceMemory grad;
    std::span<std::byte> fresh;
  };
  static constexpr size_t kSlots = 3;  // a piece copied in, one applied, one copied out

  void run_pieces(std::span<const std::byte> grad, size_t element_bytes,
                  const std::byte* device_value, std::span<std::byte> fresh,
                  const EnqueuePiece& enqueue);
  // Waits for the slot's stream, then copies its staged fresh values out.
  void drain(Slot& slot);

  uint32_t ordinal_;
  std::vector<Slot> slots_;  // used on the owning shard's loop only
};

// A variable part in device memory: value and one buffer per optimizer state slot.
class CudaVariable final : public DeviceVariable {
 public:
  CudaVariable(CudaDevice& device, const OptimizerSpec& optimizer, DType dtype,
               std::span<const std::byte> initial);
  ~CudaVariable() override { cudaSetDevice(static_cast<int>(device_.spec().ordinal)); }
  void apply(uint64_t offset, std::span<const std::byte> grad, uint64_t t,
             uint64_t variance_frozen_after, std::span<std::byte> fresh) override;
  void read_state(int slot, uint64_t offset, std::span<std::byte> out) const override;
  void write_state(int slot, uint64_t offset, std::span<const std::byte> in) override;

 private:
  template <typename T>
  DeviceRange<T> range(uint64_t first, uint64_t count, const std::byte* device_grad) const;
  // Device address of byte `offset * element bytes` of state slot `slot`, after checking that
  // `bytes` from there fit in the slot.
  std::byte* state_at(int slot, uint64_t offset, size_t bytes) const;
  void fill_slot(DeviceMemory& slot, double value) const;

  CudaDevice& device_;
  OptimizerSpec optimizer_;
  DType dtype_;
  uint64_t size_;  // elements
  DeviceMemory value_;
  std::vector<DeviceMemory> state_;  // state_slots(optimizer_) buffers like value_
};

CudaDevice::CudaDevice(uint32_t ordinal, size_t staging_bytes) : ordinal_(ordinal) {
  make_current();
  for (size_t i = 0; i < kSlots; ++i)
    slots_.push_back({CudaStream(), PinnedMemory(staging_bytes), DeviceMemory(staging_bytes), {}});
}

void CudaDevice::make_current() const {
  check_cuda(cudaSetDevice(static_cast<int>(ordinal_)), "selecting device cuda:{}", ordinal_);
}

std::unique_ptr<DeviceVariable> CudaDevice::allocate(const OptimizerSpec& optimizer, DType dtype,
                                                     std::span<const std::byte> initial) {
  make_current();
  return std::make_unique<CudaVariable>(*this, optimizer, dtype, initial);
}

void CudaDevice::pipeline(std::span<const std::byte> grad, size_t element_bytes,
                          const std::byte* device_value, std::span<std::byte> fresh,
                          const EnqueuePiece& enqueue) {
  PSCHED_REQUIRE(fresh.size() == grad.size() && grad.size() % element_bytes == 0, fresh.size(),
                 grad.size(), element_bytes);
  make_current();
  try {
    run_pieces(grad, element_bytes, device_value, fresh, enqueue);
  } catch (...) {  // leave no copy pending into the caller's `fresh`
    for (Slot& slot : slots_) {
      cudaStreamSynchronize(slot.stream.get());
      slot.fresh = {};
    }
    throw;
  }
}

void CudaDevice::run_pieces(std::span<const std::byte> grad, size_t element_bytes,
                            const std::byte* device_value, std::span<std::byte> fresh,
                            const EnqueuePiece& enqueue) {
  const size_t piece_bytes = slots_[0].staging.size() / element_bytes * element_bytes;
  for (size_t begin = 0, i = 0; begin < grad.size(); begin += piece_bytes, ++i) {
    const size_t bytes = std::min(piece_bytes, grad.size() - begin);
    Slot& slot = slots_[i % slots_.size()];
    drain(slot);
    std::memcpy(slot.staging.data(), grad.data() + begin, bytes);
    cudaStream_t stream = slot.stream.get();
    check_cuda(cudaMemcpyAsync(slot.grad.data(), slot.staging.data(), bytes, cudaMemcpyHostToDevice,
                               stream),
               "copying {} gradient bytes to cuda:{}", bytes, ordinal_);
    enqueue(begin / element_bytes, bytes / element_bytes, slot.grad.data(), stream);
    check_cuda(cudaMemcpyAsync(slot.staging.data(), device_value + begin, bytes,
                               cudaMemcpyDeviceToHost, stream),
               "copying {} value bytes from cuda:{}", bytes, ordinal_);
    slot.fresh = fresh.subspan(begin, bytes);
  }
  for (Slot& slot : slots_) drain(slot);
}

void CudaDevice::drain(Slot& slot) {
  check_cuda(cudaStreamSynchronize(slot.stream.get()), "applying on cuda:{}", ordinal_);
  if (slot.fresh.empty()) return;
  std::memcpy(slot.fresh.data(), slot.staging.data(), slot.fresh.size());
  slot.fresh = {};
}

CudaVariable::CudaVariable(CudaDevice& device, const OptimizerSpec& optimizer, DType dtype,
                           std::span<const std::byte> initial)
    : device_(device),
      optimizer_(optimizer),
      dtype_(dtype),
      size_(initial.size() / element_bytes(dtype)),
      value_(initial.size()) {
  check_cuda(cudaMemcpy(value_.data(), initial.data(), initial.size(), cudaMemcpyHostToDevice),
             "copying {} initial value bytes to cuda:{}", initial.size(), device.spec().ordinal);
  for (int k = 0; k < state_slots(optimizer); ++k) {
    state_.emplace_back(initial.size());
    fill_slot(state_.back(), initial_state_value(optimizer, k));
  }
}

void CudaVariable::fill_slot(DeviceMemory& slot, double value) const {
  if (value == 0) {
    check_cuda(cudaMemset(slot.data(), 0, slot.size()), "clearing optimizer state");
    return;
  }
  std::vector<std::byte> host(slot.size());
  visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(reinterpret_cast<T*>(host.data()), size_, static_cast<T>(value));
  });
  check_cuda(cudaMemcpy(slot.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
             "filling optimizer state");
}

template <typename T>
DeviceRange<T> CudaVariable::range(uint64_t first, uint64_t count,
                                   const std::byte* device_grad) const {
  DeviceRange<T> r{element<T>(value_, first), reinterpret_cast<const T*>(device_grad), {}, count};
  for (size_t k = 0; k < state_.size(); ++k) r.state[k] = element<T>(state_[k], first);
  return r;
}

void CudaVariable::apply(uint64_t offset, std::span<const std::byte> grad, uint64_t t,
                         uint64_t variance_frozen_after, std::span<std::byte> fresh) {
  const size_t bytes = element_bytes(dtype_);
  PSCHED_REQUIRE(offset + grad.size() / bytes <= size_, offset, grad.size(), size_);
  device_.pipeline(grad, bytes, value_.data() + offset * bytes, fresh,
                   [&](uint64_t first, uint64_t count, const std::byte* device_grad, Stream s) {
                     visit_dtype(dtype_, [&](auto zero) {
                       using T = decltype(zero);
                       enqueue_apply(optimizer_, range<T>(offset + first, count, device_grad), t,
                                     variance_frozen_after, s);
                     });
                   });
}

std::byte* CudaVariable::state_at(int slot, uint64_t offset, size_t bytes) const {
  const size_t element = element_bytes(dtype_);
  PSCHED_REQUIRE(slot >= 0 && static_cast<size_t>(slot) < state_.size(), slot, state_.size());
  PSCHED_REQUIRE(offset + bytes / element <= size_, offset, bytes, size_);
  return state_[slot].data() + offset * element;
}

void CudaVariable::read_state(int slot, uint64_t offset, std::span<std::byte> out) const {
  std::byte* from = state_at(slot, offset, out.size());
  device_.make_current();
  check_cuda(cudaMemcpy(out.data(), from, out.size(), cudaMemcpyDeviceToHost),
             "copying optimizer state from cuda:{}", device_.spec().ordinal);
}

void CudaVariable::write_state(int slot, uint64_t offset, std::span<const std::byte> in) {
  std::byte* to = state_at(slot, offset, in.size());
  device_.make_current();
  check_cuda(cudaMemcpy(to, in.data(), in.size(), cudaMemcpyHostToDevice),
             "copying optimizer state to cuda:{}", device_.spec().ordinal);
}

// Why no device can be used, or an empty string.
std::string unavailable_reason(uint32_t ordinal) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it: later calls should not report it again
    return fmt::format("no usable CUDA device on this machine (cudaGetDeviceCount: {}: {})",
                       cudaGetErrorName(status), cudaGetErrorString(status));
  }
  if (count == 0) return "this machine has no CUDA device";
  if (ordinal >= static_cast<uint32_t>(count))
    return fmt::format("this machine has {} CUDA device(s), cuda:0 to cuda:{}", count, count - 1);
  return {};
}

}  // namespace
}  // namespace gpu

bool built_with_cuda() {
  return true;
}

std::unique_ptr<ComputeDevice> ComputeDevice::open(const DeviceSpec& device, size_t staging_bytes) {
  PSCHED_REQUIRE(device.kind == DeviceSpec::Kind::cuda, to_string(device));
  PSCHED_REQUIRE(staging_bytes >= 8 && staging_bytes % 8 == 0, staging_bytes);
  if (std::string why = gpu::unavailable_reason(device.ordinal); !why.empty())
    fail(ErrorCode::bad_config, "device {} is not available: {}", to_string(device), why);
  return std::make_unique<gpu::CudaDevice>(device.ordinal, staging_bytes);
}

}  // namespace psched::optim
