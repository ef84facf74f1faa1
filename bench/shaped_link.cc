#include "bench/shaped_link.h"

#include <algorithm>

namespace psched::bench {

kj::Promise<void> LinkShaper::transfer(size_t bytes) {
  kj::TimePoint now = timer_.now();
  double seconds = static_cast<double>(bytes) / bytes_per_s_;
  busy_s_ += seconds;
  free_at_ = std::max(free_at_, now) + static_cast<int64_t>(seconds * 1e9) * kj::NANOSECONDS;
  return timer_.atTime(free_at_);
}

kj::Promise<size_t> ShapedStream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  return inner_->tryRead(buffer, min_bytes, max_bytes).then([this](size_t n) {
    return down_.transfer(n).then([n] { return n; });
  });
}

kj::Promise<void> ShapedStream::write(const void* buffer, size_t size) {
  return up_.transfer(size).then([this, buffer, size] { return inner_->write(buffer, size); });
}

kj::Promise<void> ShapedStream::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  size_t size = 0;
  for (auto piece : pieces) size += piece.size();
  return up_.transfer(size).then([this, pieces] { return inner_->write(pieces); });
}

}  // namespace psched::bench
