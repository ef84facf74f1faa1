// SPDX-License-Identifier: Apache-2.0
#include "net/prefixed_stream.h"

#include <algorithm>
#include <cstring>

#include "net/forwarding_stream.h"

namespace psched {
namespace {

class PrefixedStream final : public ForwardingStream {
 public:
  PrefixedStream(kj::Own<kj::AsyncIoStream> inner, kj::Array<kj::byte> prefix)
      : ForwardingStream(kj::mv(inner)), prefix_(kj::mv(prefix)) {}

  kj::Promise<size_t> tryRead(void* out, size_t min, size_t max) override {
    size_t n = std::min(max, prefix_.size() - taken_);
    if (n == 0) return inner().tryRead(out, min, max);
    std::memcpy(out, prefix_.begin() + taken_, n);
    taken_ += n;
    if (n >= min) return n;
    return inner()
        .tryRead(static_cast<kj::byte*>(out) + n, min - n, max - n)
        .then([n](size_t more) { return n + more; });
  }

 private:
  kj::Array<kj::byte> prefix_;
  size_t taken_ = 0;
};

}  // namespace

kj::Own<kj::AsyncIoStream> with_prefix(kj::Own<kj::AsyncIoStream> stream,
                                       kj::Array<kj::byte> prefix) {
  return kj::heap<PrefixedStream>(kj::mv(stream), kj::mv(prefix));
}

}  // namespace psched
