// SPDX-License-Identifier: Apache-2.0
// A stream whose reads fail when its peer stops in the middle of a Cap'n Proto frame: a
// connection that sent part of a message and then nothing for `timeout` is dropped, so a
// stalled half-frame cannot pin its buffer forever. Between frames a peer may stay silent as
// long as it likes (a worker between steps). KJ thread only.
#pragma once

#include <cstdint>
#include <vector>

#include <kj/async-io.h>
#include <kj/timer.h>

namespace psched {

// Follows the stream framing (segment count - 1, segment sizes in words, padding, segments)
// over the bytes of consecutive reads, to tell whether a frame is incomplete.
class FrameTracker {
 public:
  void consume(const kj::byte* bytes, size_t size);
  // True when the bytes so far end inside a frame. False for ever after a header that Cap'n
  // Proto refuses (the reader drops the connection itself).
  bool mid_frame() const { return !refused_ && (!header_.empty() || body_left_ > 0); }

 private:
  // Adds one header byte; when the header is complete, sets body_left_.
  void header_byte(kj::byte b);

  std::vector<kj::byte> header_;  // of the frame being read; empty between frames
  uint64_t body_left_ = 0;        // bytes of the current frame's segments still to come
  bool refused_ = false;
};

// `stream`, whose reads inside a frame fail with DISCONNECTED after `timeout` without a byte.
// `timer` outlives the stream.
kj::Own<kj::AsyncIoStream> with_frame_deadline(kj::Own<kj::AsyncIoStream> stream, kj::Timer& timer,
                                               kj::Duration timeout);

}  // namespace psched
