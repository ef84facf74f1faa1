// SPDX-License-Identifier: Apache-2.0
// Where a shard keeps its variables' values and optimizer state: host memory (the default, the
// Eigen kernels of optimizer.h) or one CUDA GPU (`device: cuda:N` in the deployment file).
//
// This header needs no CUDA headers and is the same in every build. In a build without CUDA
// support (CMake option PSCHED_CUDA, see docs/gpu.md) ComputeDevice::open fails for every
// CUDA device with a message saying so; the host path never touches this file's classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "optim/optimizer.h"

namespace psched::optim {

// A device as the deployment file names it: "cpu" or "cuda:N".
struct DeviceSpec {
  enum class Kind {
    cpu,   ///< host memory, Eigen kernels (the default)
    cuda,  ///< CUDA GPU number `ordinal`, fused CUDA kernels
  };
  Kind kind = Kind::cpu;
  uint32_t ordinal = 0;  // CUDA device number; 0 for cpu

  bool operator==(const DeviceSpec&) const = default;
};

std::string to_string(const DeviceSpec& device);  // "cpu", "cuda:0"
// Parses "cpu" or "cuda:N" (N a decimal number); returns false on anything else.
bool parse_device(std::string_view text, DeviceSpec& out);

// Whether this build carries the CUDA kernels (CMake found nvcc and PSCHED_CUDA was not OFF).
bool built_with_cuda();

// One variable part's value and optimizer state, resident on a device. Owned by the host
// Variable, which keeps the authoritative host copy of the value for replies. Not thread-safe:
// used on its shard's loop only. Element offsets and counts are in elements of the dtype
// given to ComputeDevice::allocate; byte spans hold whole elements.
class DeviceVariable {
 public:
  virtual ~DeviceVariable() = default;

  // One optimizer update (optim::apply's formula, `t` and `variance_frozen_after` likewise) of
  // the elements [offset, offset + n), n = grad.size() / element bytes. `grad` is host memory, only
  // read, any alignment. The fresh values of those elements are written to `fresh` (host memory,
  // grad.size() bytes) before this returns. Throws psched::Error(internal) on a CUDA failure.
  virtual void apply(uint64_t offset, std::span<const std::byte> grad, uint64_t t,
                     uint64_t variance_frozen_after, std::span<std::byte> fresh) = 0;
  // Copies elements [offset, offset + out.size() / element bytes) of optimizer state slot
  // `slot` (optimizer.h's slot order) to host memory `out`.
  virtual void read_state(int slot, uint64_t offset, std::span<std::byte> out) const = 0;
  // The reverse: overwrites those elements of slot `slot` with host memory `in` (restoring a
  // checkpoint).
  virtual void write_state(int slot, uint64_t offset, std::span<const std::byte> in) = 0;
};

// A shard's handle on its device: for CUDA, the GPU's streams and the pooled pinned buffers
// that every transfer goes through. One per shard; it outlives the shard's variables.
class ComputeDevice {
 public:
  // Bytes of each pinned staging buffer: a partition is copied, applied and copied back in
  // pieces of this size, a few in flight at once so that copies overlap the kernels.
  static constexpr size_t kDefaultStagingBytes = 4 << 20;

  // Opens CUDA device `device` (kind cuda) with staging buffers of `staging_bytes` (a
  // multiple of 8). Throws psched::Error(bad_config) naming the device when this build has no
  // CUDA support, the machine has no usable CUDA device, or it has no device number `ordinal`.
  static std::unique_ptr<ComputeDevice> open(const DeviceSpec& device,
                                             size_t staging_bytes = kDefaultStagingBytes);

  virtual ~ComputeDevice() = default;
  virtual DeviceSpec spec() const = 0;
  // Places a variable part of `initial.size() / element_bytes(dtype)` elements on the device:
  // the value `initial` and state_slots(optimizer) slots filled with initial_state_value.
  // `optimizer` must have passed validate(). Throws psched::Error(overloaded) when the device
  // is out of memory.
  virtual std::unique_ptr<DeviceVariable> allocate(const OptimizerSpec& optimizer, DType dtype,
                                                   std::span<const std::byte> initial) = 0;
};

}  // namespace psched::optim
