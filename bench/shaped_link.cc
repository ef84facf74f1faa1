// SPDX-License-Identifier: Apache-2.0
#include "bench/shaped_link.h"

#include <algorithm>

namespace psched::bench {

kj::Promise<void> LinkShaper::transfer(size_t bytes) {
  kj::TimePoint now = timer_.now();
  double seconds = static_cast<double>(bytes) / bytes_per_s_;
  busy_s_ += seconds;
  // A link idle for less than kBurst is treated as busy until now: such gaps are the event
  // loop waking late (epoll timeouts are in milliseconds), not idleness, and must not lower
  // the rate. Like tc tbf's burst, a truly idle link may thus send kBurst worth at once.
  free_at_ =
      std::max(free_at_, now - kBurst) + static_cast<int64_t>(seconds * 1e9) * kj::NANOSECONDS;
  return timer_.atTime(free_at_);
}

kj::Promise<size_t> ShapedStream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  return read_chunks(static_cast<kj::byte*>(buffer), std::max<size_t>(min_bytes, 1), max_bytes, 0);
}

kj::Promise<size_t> ShapedStream::read_chunks(kj::byte* buffer, size_t min_bytes, size_t max_bytes,
                                              size_t done) {
  size_t most = std::min(max_bytes - done, kChunkBytes);
  size_t least = std::min(min_bytes - done, most);
  return inner_->tryRead(buffer + done, least, most)
      .then([this, buffer, min_bytes, max_bytes, done](size_t n) {
        return down_.transfer(n).then([this, buffer, min_bytes, max_bytes, done, n] {
          size_t total = done + n;
          if (n == 0 || total >= min_bytes) return kj::Promise<size_t>(total);
          return read_chunks(buffer, min_bytes, max_bytes, total);
        });
      });
}

kj::Promise<void> ShapedStream::write_chunks(const kj::byte* data, size_t size) {
  size_t n = std::min(size, kChunkBytes);
  return up_.transfer(n)
      .then([this, data, n] { return inner_->write(data, n); })
      .then([this, data, size, n]() -> kj::Promise<void> {
        if (size == n) return kj::READY_NOW;
        return write_chunks(data + n, size - n);
      });
}

kj::Promise<void> ShapedStream::write(const void* buffer, size_t size) {
  if (size == 0) return kj::READY_NOW;
  return write_chunks(static_cast<const kj::byte*>(buffer), size);
}

kj::Promise<void> ShapedStream::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  // The caller keeps the pieces alive until the promise resolves, not the array of them.
  auto copy = kj::heapArray(pieces);
  kj::Promise<void> written = kj::READY_NOW;
  for (auto piece : copy)
    if (piece.size() > 0)
      written = written.then([this, piece] { return write_chunks(piece.begin(), piece.size()); });
  return written.attach(kj::mv(copy));
}

}  // namespace psched::bench
