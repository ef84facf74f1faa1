// SPDX-License-Identifier: Apache-2.0
// Internal to optim/gpu (CUDA builds only): owners of CUDA resources. Each is created on the
// CUDA device current on the calling thread and must be destroyed while the process's CUDA
// context lives. Move-only; destruction never throws (errors there are ignored: nothing could
// be done about them).
#pragma once

#include <cstddef>
#include <memory>

#include <cuda_runtime_api.h>

namespace psched::optim::gpu {

// `bytes` of uninitialised device memory (cudaMalloc).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes);  // throws Error(overloaded) when the device is full
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { cudaFree(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

// `bytes` of uninitialised page-locked host memory (cudaMallocHost): the only host memory the
// GPU's copy engines read and write asynchronously.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes);  // throws Error(overloaded) when none can be had
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

// A non-blocking CUDA stream (it does not wait for the legacy default stream).
class CudaStream {
 public:
  CudaStream();
  cudaStream_t get() const { return stream_.get(); }

 private:
  struct Destroy {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  std::unique_ptr<CUstream_st, Destroy> stream_;
};

}  // namespace psched::optim::gpu
