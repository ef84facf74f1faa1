#include "common/buffer_pool.h"

#include <bit>

namespace psched {

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) {
  if (this != &other) {
    this->~PooledBuffer();
    new (this) PooledBuffer(std::move(other));
  }
  return *this;
}

PooledBuffer::~PooledBuffer() {
  if (buffer_.data() == nullptr) return;
  if (auto pool = pool_.lock()) pool->give_back(std::move(buffer_));
}

std::shared_ptr<BufferPool> BufferPool::create(size_t max_per_class) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_per_class));
}

size_t BufferPool::size_class(size_t bytes) {
  return bytes <= 64 ? 6 : std::bit_width(bytes - 1);  // capacity 2^class
}

PooledBuffer BufferPool::take(size_t bytes) {
  size_t cls = size_class(bytes);
  {
    std::lock_guard lock(mutex_);
    if (cls < idle_.size() && !idle_[cls].empty()) {
      AlignedBuffer buffer = std::move(idle_[cls].back());
      idle_[cls].pop_back();
      buffer.resize_within_capacity(bytes);
      return PooledBuffer(std::move(buffer), weak_from_this());
    }
  }
  AlignedBuffer buffer(size_t{1} << cls);
  buffer.resize_within_capacity(bytes);
  return PooledBuffer(std::move(buffer), weak_from_this());
}

void BufferPool::give_back(AlignedBuffer buffer) {
  // take() serves class c (capacity 2^c) only for sizes in (2^(c-1), 2^c], so the visible
  // size still names the class of the capacity.
  size_t cls = size_class(buffer.size());
  std::lock_guard lock(mutex_);
  if (idle_.size() <= cls) idle_.resize(cls + 1);
  if (idle_[cls].size() < max_per_class_) idle_[cls].push_back(std::move(buffer));
}

}  // namespace psched
