// SPDX-License-Identifier: Apache-2.0
#include "optim/gpu/cuda_memory.h"

#include "optim/gpu/cuda_check.h"

namespace psched::optim::gpu {

DeviceMemory::DeviceMemory(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "allocating {} bytes of device memory", bytes);
  data_.reset(static_cast<std::byte*>(p));
}

PinnedMemory::PinnedMemory(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  check_cuda(cudaMallocHost(&p, bytes), "allocating {} bytes of pinned host memory", bytes);
  data_.reset(static_cast<std::byte*>(p));
}

CudaStream::CudaStream() {
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
  stream_.reset(s);
}

}  // namespace psched::optim::gpu
