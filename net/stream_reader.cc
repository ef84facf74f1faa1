// SPDX-License-Identifier: Apache-2.0
#include "net/stream_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <sys/socket.h>
#include <sys/utsname.h>

#include "common/check.h"

namespace psched {
namespace {

// A read straight into place resolves after at least this much, so received() moves while a
// large body arrives; KJ reads on without a promise per piece until then. Over a plain socket
// it is also the most a read sleeps for (the low-water mark).
constexpr size_t kPieceBytes = 1 << 20;

kj::Exception mark_refused() {
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                       kj::str("the socket refused to lower its receive low-water mark"));
}

kj::Exception ended_early() {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                       kj::str("the stream ended inside a frame"));
}

}  // namespace

StreamReader::StreamReader(kj::AsyncIoStream& stream, size_t buffer_bytes, bool plain_socket)
    : stream_(stream), buffer_(kj::heapArray<kj::byte>(buffer_bytes)) {
  if (!plain_socket || !can_mark_sockets()) return;
  KJ_IF_MAYBE (fd, stream.getFd()) {
    socket_fd_ = *fd;
  }
}

bool StreamReader::can_mark_sockets() {
  static const bool kCan = [] {
    utsname system{};
    int major = 0, minor = 0;
    if (uname(&system) != 0 || std::sscanf(system.release, "%d.%d", &major, &minor) != 2)
      return false;
    return std::string_view(system.sysname) == "Linux" &&
           (major > 5 || (major == 5 && minor >= 11));
  }();
  return kCan;
}

bool StreamReader::set_low_water(size_t bytes) {
  if (bytes == low_water_) return true;
  int value = static_cast<int>(bytes);
  if (::setsockopt(socket_fd_, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof value) != 0) return false;
  low_water_ = bytes;
  return true;
}

void StreamReader::take(void* out, size_t n) {
  PSCHED_REQUIRE(n <= buffered(), n, buffered());
  std::memcpy(out, buffer_.begin() + begin_, n);
  consume(n);
}

void StreamReader::consume(size_t n) {
  begin_ += n;
  if (begin_ == end_) begin_ = end_ = 0;  // empty: the whole buffer is room again
}

kj::Promise<bool> StreamReader::fill(size_t min) {
  PSCHED_REQUIRE(min <= buffer_.size(), min, buffer_.size());
  if (buffered() >= min) return true;
  // Down from a body's mark, which could ask for more than the next frame has (it stays up
  // when a read straight into place was dropped).
  if (socket_fd_ >= 0 && !set_low_water(1)) return mark_refused();
  if (buffer_.size() - begin_ < min) {  // no room behind what is buffered: move it to the front
    std::memmove(buffer_.begin(), buffer_.begin() + begin_, buffered());
    end_ -= begin_;
    begin_ = 0;
  }
  return stream_.tryRead(buffer_.begin() + end_, 1, buffer_.size() - end_)
      .then([this, min](size_t n) -> kj::Promise<bool> {
        end_ += n;
        received_ += n;
        if (n == 0) return false;
        return fill(min);
      });
}

kj::Promise<void> StreamReader::read(void* out, size_t n) {
  KJ_IF_MAYBE (rest, read_or_wait(out, n)) {
    return kj::mv(*rest);
  }
  return kj::READY_NOW;
}

kj::Maybe<kj::Promise<void>> StreamReader::read_or_wait(void* out, size_t n) {
  auto* to = static_cast<kj::byte*>(out);
  size_t taken = std::min(n, buffered());
  take(to, taken);
  to += taken;
  n -= taken;
  if (n == 0) return nullptr;
  if (n >= buffer_.size()) return read_direct(to, n);
  return fill(n).then([this, to, n](bool filled) {
    if (!filled) kj::throwFatalException(ended_early());
    take(to, n);
  });
}

kj::Promise<void> StreamReader::read_direct(kj::byte* out, size_t n) {
  if (socket_fd_ >= 0) {
    if (set_low_water(std::min(n, kPieceBytes))) return read_direct_marked(out, n);
    if (low_water_ != 1) return mark_refused();  // a mark is up and could not be moved
    socket_fd_ = -1;  // refused from the start: read as a stream from now on
  }
  size_t piece = std::min(n, kPieceBytes);
  return stream_.tryRead(out, piece, n)
      .then([this, out, n, piece](size_t got) -> kj::Promise<void> {
        received_ += got;
        if (got < piece) return ended_early();
        if (got == n) return kj::READY_NOW;
        return read_direct(out + got, n - got);
      });
}

kj::Promise<void> StreamReader::read_direct_marked(kj::byte* out, size_t n) {
  // One byte at least: the read takes what arrived when the mark woke it, or what was there
  // already. The mark never asks for more than the body still has to come.
  return stream_.tryRead(out, 1, n).then([this, out, n](size_t got) -> kj::Promise<void> {
    received_ += got;
    if (got == 0) return ended_early();
    if (got == n) return kj::READY_NOW;
    if (!set_low_water(std::min(n - got, kPieceBytes))) return mark_refused();
    return read_direct_marked(out + got, n - got);
  });
}

kj::Promise<void> StreamReader::skip(uint64_t n) {
  size_t dropped = std::min<uint64_t>(n, buffered());
  consume(dropped);
  if (n == dropped) return kj::READY_NOW;
  return fill(1).then([this, left = n - dropped](bool filled) -> kj::Promise<void> {
    if (!filled) return ended_early();
    return skip(left);
  });
}

}  // namespace psched
