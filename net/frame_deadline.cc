// SPDX-License-Identifier: Apache-2.0
#include "net/frame_deadline.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "net/forwarding_stream.h"

namespace psched {
namespace {

// Cap'n Proto refuses frames of more segments than this; the tracker stops following them.
constexpr uint64_t kMaxSegments = 512;

uint32_t little_endian32(const kj::byte* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

class DeadlineStream final : public ForwardingStream {
 public:
  DeadlineStream(kj::Own<kj::AsyncIoStream> inner, kj::Timer& timer, kj::Duration timeout)
      : ForwardingStream(kj::mv(inner)), timer_(timer), timeout_(timeout) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return read_at_least(static_cast<kj::byte*>(buffer), min, max, 0);
  }

 private:
  // Reads piece by piece until `min` bytes are in (or the end), each piece inside a frame
  // under the deadline, so a slow but steady peer never times out.
  kj::Promise<size_t> read_at_least(kj::byte* buffer, size_t min, size_t max, size_t got) {
    auto read = inner().tryRead(buffer + got, 1, max - got);
    if (frames_.mid_frame()) read = read.exclusiveJoin(stalled());
    return read.then([this, buffer, min, max, got](size_t n) -> kj::Promise<size_t> {
      frames_.consume(buffer + got, n);
      if (n == 0 || got + n >= min) return got + n;
      return read_at_least(buffer, min, max, got + n);
    });
  }
  kj::Promise<size_t> stalled() {
    return timer_.afterDelay(timeout_).then([seconds = timeout_ / kj::SECONDS] {
      std::string why = fmt::format(
          "peer silent for {} s inside a message (limits.stall_timeout_seconds)", seconds);
      log_warn("dropping a connection: {}", why);
      return kj::Promise<size_t>(kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__,
                                               __LINE__, kj::heapString(why.data(), why.size())));
    });
  }

  kj::Timer& timer_;
  kj::Duration timeout_;
  FrameTracker frames_;
};

}  // namespace

void FrameTracker::consume(const kj::byte* bytes, size_t size) {
  while (size > 0 && !refused_) {
    if (body_left_ > 0) {
      uint64_t skip = std::min<uint64_t>(size, body_left_);
      body_left_ -= skip;
      bytes += skip;
      size -= skip;
    } else {
      header_byte(*bytes++);
      --size;
    }
  }
}

void FrameTracker::header_byte(kj::byte b) {
  header_.push_back(b);
  if (header_.size() < 4) return;
  uint64_t segments = uint64_t(little_endian32(header_.data())) + 1;
  if (segments > kMaxSegments) {
    refused_ = true;
    return;
  }
  size_t header_bytes = (4 + 4 * segments + 7) / 8 * 8;
  if (header_.size() < header_bytes) return;
  for (uint64_t i = 0; i < segments; ++i)
    body_left_ += 8 * uint64_t(little_endian32(&header_[4 + 4 * i]));
  header_.clear();
}

kj::Own<kj::AsyncIoStream> with_frame_deadline(kj::Own<kj::AsyncIoStream> stream, kj::Timer& timer,
                                               kj::Duration timeout) {
  return kj::heap<DeadlineStream>(kj::mv(stream), timer, timeout);
}

}  // namespace psched
