// SPDX-License-Identifier: Apache-2.0
// ReceiveBuffers: the buffers a shard's data streams read gradients into, reused from push to
// push. From glibc's mmap threshold up (32 MiB, common/malloc_tuning.h) malloc maps every
// buffer afresh, and the kernel faults in and zeroes each of its pages on the first write: for
// partitions that large (fifo's whole tensors) that more than doubled the shard's CPU per byte.
// Below it, a loop thread's malloc arena (heaps of at most 64 MiB) may hand a freed large
// buffer's pages back to the kernel too: in some processes every 16 MiB push faulted its
// buffer in afresh, and its round trip took 25 ms instead of 10. So buffers from 1 MiB up are
// kept; smaller ones come from malloc, which reuses them.
//
// Lives on the shard's loop: take buffers there, and drop them there (a dropped buffer goes back
// to the pool while the pool exists, and is freed when the pool is over its budget).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common/aligned_buffer.h"

namespace psched {

class ReceiveBuffers : public std::enable_shared_from_this<ReceiveBuffers> {
 public:
  // Buffers of this size and up are kept for reuse.
  static constexpr size_t kPooledFrom = 1u << 20;

  // At most `kept_bytes` of free buffers are kept.
  explicit ReceiveBuffers(size_t kept_bytes) : budget_(kept_bytes) {}
  // Make it with make_shared: the buffers it hands out find it through a weak pointer.
  static std::shared_ptr<ReceiveBuffers> make(size_t kept_bytes) {
    return std::make_shared<ReceiveBuffers>(kept_bytes);
  }

  // A buffer of `bytes` uninitialised bytes: a kept one when one fits (the smallest that holds
  // `bytes` and is at most twice as large), else a new one.
  std::shared_ptr<AlignedBuffer> take(size_t bytes);
  // The bytes of the free buffers kept.
  size_t kept_bytes() const { return kept_; }

 private:
  struct Kept {
    AlignedBuffer buffer;
    size_t capacity;
  };
  // Keeps `buffer` (of `capacity` bytes) if the budget allows, else frees it.
  void give_back(AlignedBuffer buffer, size_t capacity);

  size_t budget_;
  size_t kept_ = 0;
  std::vector<Kept> free_;
};

}  // namespace psched
