// SPDX-License-Identifier: Apache-2.0
#include "net/read_buffer.h"

#include <algorithm>
#include <cstring>

#include "net/forwarding_stream.h"

namespace psched {
namespace {

class ReadBufferedStream final : public ForwardingStream {
 public:
  ReadBufferedStream(kj::Own<kj::AsyncIoStream> inner, size_t bytes)
      : ForwardingStream(kj::mv(inner)), buffer_(kj::heapArray<kj::byte>(bytes)) {}

  kj::Promise<size_t> tryRead(void* out, size_t min, size_t max) override {
    auto* to = static_cast<kj::byte*>(out);
    size_t taken = take(to, max);
    if (taken >= min) return taken;
    return refill(to + taken, min - taken, max - taken).then([taken](size_t n) {
      return taken + n;
    });
  }

 private:
  // Copies up to `max` buffered bytes into `out`; returns how many.
  size_t take(kj::byte* out, size_t max) {
    size_t n = std::min(max, end_ - begin_);
    if (n == 0) return 0;  // `out` may be null then, which memcpy does not allow
    std::memcpy(out, buffer_.begin() + begin_, n);
    begin_ += n;
    return n;
  }
  // The read buffer is empty: reads at least `min` bytes for the caller, through the buffer
  // unless the caller wants more than it holds.
  kj::Promise<size_t> refill(kj::byte* out, size_t min, size_t max) {
    if (max >= buffer_.size()) return inner().tryRead(out, min, max);
    return inner().tryRead(buffer_.begin(), min, buffer_.size()).then([this, out, max](size_t n) {
      begin_ = 0;
      end_ = n;
      return take(out, max);
    });
  }
  kj::Array<kj::byte> buffer_;
  size_t begin_ = 0, end_ = 0;  // the buffered bytes not yet read
};

}  // namespace

kj::Own<kj::AsyncIoStream> with_read_buffer(kj::Own<kj::AsyncIoStream> stream, size_t bytes) {
  return kj::heap<ReadBufferedStream>(kj::mv(stream), bytes);
}

}  // namespace psched
