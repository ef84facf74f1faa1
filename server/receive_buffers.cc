// SPDX-License-Identifier: Apache-2.0
#include "server/receive_buffers.h"

#include <utility>

namespace psched {

std::shared_ptr<AlignedBuffer> ReceiveBuffers::take(size_t bytes) {
  if (bytes < kPooledFrom) return std::make_shared<AlignedBuffer>(bytes);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->capacity >= bytes && it->capacity / 2 <= bytes &&
        (best == free_.end() || it->capacity < best->capacity))
      best = it;
  AlignedBuffer buffer;
  size_t capacity = bytes;
  if (best != free_.end()) {
    buffer = std::move(best->buffer);
    capacity = best->capacity;
    kept_ -= capacity;
    free_.erase(best);
    buffer.resize_within_capacity(bytes);
  } else {
    buffer = AlignedBuffer(bytes);
  }
  return std::shared_ptr<AlignedBuffer>(new AlignedBuffer(std::move(buffer)),
                                        [pool = weak_from_this(), capacity](AlignedBuffer* taken) {
                                          std::unique_ptr<AlignedBuffer> owned(taken);
                                          if (auto alive = pool.lock())
                                            alive->give_back(std::move(*owned), capacity);
                                        });
}

void ReceiveBuffers::give_back(AlignedBuffer buffer, size_t capacity) {
  if (kept_ + capacity > budget_) return;  // freed
  kept_ += capacity;
  free_.push_back({std::move(buffer), capacity});
}

}  // namespace psched
