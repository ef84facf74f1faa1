// SPDX-License-Identifier: Apache-2.0
// Owned, 64-byte aligned bytes: variable values and optimizer state on a shard, pooled message
// buffers. Move-only; never copies by accident.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

namespace psched {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` uninitialised bytes.
  explicit AlignedBuffer(size_t bytes)
      : data_(static_cast<std::byte*>(std::aligned_alloc(64, round_up(bytes)))), size_(bytes) {
    if (bytes && !data_) throw std::bad_alloc();
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<std::byte> bytes() { return {data(), size_}; }
  std::span<const std::byte> bytes() const { return {data(), size_}; }

  // The bytes as elements of T (size() must be a multiple of sizeof(T)).
  template <typename T>
  std::span<T> as() {
    return {reinterpret_cast<T*>(data()), size_ / sizeof(T)};
  }
  template <typename T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(data()), size_ / sizeof(T)};
  }

  // Shrinks the visible size without reallocating (a pooled buffer serving a smaller request).
  void resize_within_capacity(size_t bytes) { size_ = bytes; }

 private:
  static size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0); }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

}  // namespace psched
