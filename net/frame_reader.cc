// SPDX-License-Identifier: Apache-2.0
#include "net/frame_reader.h"

namespace psched {

FrameReader::FrameReader(kj::AsyncIoStream& stream, bool plain_socket)
    : reader_(stream, StreamReader::kBufferBytes, plain_socket) {}

kj::Promise<void> FrameReader::run(Serve serve, Room room) {
  serve_ = std::move(serve);
  room_ = std::move(room);
  return read_frames();
}

kj::Promise<void> FrameReader::read_frames() {
  for (;;) {
    if (room_) {
      KJ_IF_MAYBE (waiting, room_()) {
        return waiting->then([this] { return read_frames(); });
      }
    }
    if (reader_.buffered() < header_.size()) break;
    reader_.take(header_.data(), header_.size());
    KJ_IF_MAYBE (finishing, serve_(header_)) {
      waiting_for_ = Wait::body;
      return finishing->then([this] {
        waiting_for_ = Wait::nothing;
        return read_frames();
      });
    }
  }
  waiting_for_ = Wait::header;
  return reader_.fill(header_.size()).then([this](bool filled) -> kj::Promise<void> {
    waiting_for_ = Wait::nothing;
    if (filled) return read_frames();
    if (reader_.buffered() == 0) return kj::READY_NOW;  // closed between frames
    return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                         kj::str("the peer closed the data stream inside a frame"));
  });
}

kj::Promise<void> FrameReader::stalls(kj::Timer& timer, kj::Duration timeout, const char* setting) {
  return stalls_after(timer, timeout, setting, reader_.received(), timer.now());
}

kj::Promise<void> FrameReader::stalls_after(kj::Timer& timer, kj::Duration timeout,
                                            const char* setting, uint64_t seen,
                                            kj::TimePoint quiet_since) {
  return timer.afterDelay(timeout / 8).then([this, &timer, timeout, setting, seen, quiet_since] {
    kj::TimePoint now = timer.now();
    if (!inside_frame() || reader_.received() != seen)
      return stalls_after(timer, timeout, setting, reader_.received(), now);
    if (now - quiet_since < timeout)
      return stalls_after(timer, timeout, setting, seen, quiet_since);
    return kj::Promise<void>(kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                                           kj::str("data stream silent for ", timeout / kj::SECONDS,
                                                   " s inside a frame (", setting, ")")));
  });
}

}  // namespace psched
