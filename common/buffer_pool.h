// Reuses large message buffers: allocating and faulting in a fresh multi-megabyte buffer per
// message costs ~5x throughput on our VMs (DESIGN §8). Buffers are kept per power-of-two
// size class; a PooledBuffer hands its memory back when destroyed. Thread-safe: buffers are
// filled on an actor's strand and drained on the KJ thread.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "common/aligned_buffer.h"

namespace psched {

class BufferPool;

// A buffer on loan from a BufferPool (or owned outright when the pool is gone or absent).
class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(AlignedBuffer buffer, std::weak_ptr<BufferPool> pool)
      : buffer_(std::move(buffer)), pool_(std::move(pool)) {}
  PooledBuffer(PooledBuffer&&) = default;
  PooledBuffer& operator=(PooledBuffer&& other);
  ~PooledBuffer();

  std::byte* data() { return buffer_.data(); }
  const std::byte* data() const { return buffer_.data(); }
  size_t size() const { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
  std::weak_ptr<BufferPool> pool_;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_per_class` idle buffers per size class.
  static std::shared_ptr<BufferPool> create(size_t max_per_class = 8);

  // A buffer of exactly `bytes` visible bytes (uninitialised), reused when one is idle.
  PooledBuffer take(size_t bytes);

 private:
  explicit BufferPool(size_t max_per_class) : max_per_class_(max_per_class) {}
  friend class PooledBuffer;
  void give_back(AlignedBuffer buffer);
  static size_t size_class(size_t bytes);

  size_t max_per_class_;
  std::mutex mutex_;
  std::vector<std::vector<AlignedBuffer>> idle_;  // by size class; guarded by mutex_
};

}  // namespace psched
