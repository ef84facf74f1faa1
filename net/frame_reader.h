// SPDX-License-Identifier: Apache-2.0
// FrameReader: reads a data stream's frames (net/data_frame.h) on the loop, for both ends: the
// shard reads requests, the worker answers. Headers already buffered are served at once, one
// after the other, so the frames that arrived together are read in one go; only a read that
// must wait for the peer costs a promise. Bodies are read by whoever serves the header, through
// body(): into their destination, or skipped. KJ thread only.
#pragma once

#include <cstdint>
#include <functional>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "net/data_frame.h"
#include "net/stream_reader.h"

namespace psched {

class FrameReader {
 public:
  // Serves one frame whose header was just read: null when done (its body, if any, taken from
  // body() already), else the promise that finishes it (the rest of its body to read, or a
  // rejection that ends the stream).
  using Serve = std::function<kj::Maybe<kj::Promise<void>>(const FrameHeaderBytes& header)>;
  // Null when another frame may be read now; else what to wait for first (back-pressure).
  using Room = std::function<kj::Maybe<kj::Promise<void>>()>;

  // Reads `stream`, which outlives the reader. `plain_socket`: it is the TCP socket itself
  // (net/stream_reader.h).
  FrameReader(kj::AsyncIoStream& stream, bool plain_socket);

  // Reads frames and hands each to `serve`, waiting for `room` (when given) before each. Resolves
  // when the peer closes the stream between frames; rejects with DISCONNECTED when it closes
  // inside one. Call once; the reader outlives the promise.
  kj::Promise<void> run(Serve serve, Room room = nullptr);

  // The stream under the frames: a header's body is read from here.
  StreamReader& body() { return reader_; }

  // Rejects with DISCONNECTED once the peer has sent nothing for `timeout` while a frame of it
  // is begun; never resolves otherwise. It looks an eighth of the timeout apart, so no single
  // read pays for a timer, and a stall is found at most a quarter of the timeout late. `setting`
  // names what sets the timeout, for the message.
  kj::Promise<void> stalls(kj::Timer& timer, kj::Duration timeout, const char* setting);

 private:
  kj::Promise<void> read_frames();
  // `seen`: the bytes received at `quiet_since`, the last look that found no frame begun or
  // new bytes.
  kj::Promise<void> stalls_after(kj::Timer& timer, kj::Duration timeout, const char* setting,
                                 uint64_t seen, kj::TimePoint quiet_since);
  // Whether the rest of a begun frame is awaited.
  bool inside_frame() const {
    return waiting_for_ == Wait::body || (waiting_for_ == Wait::header && reader_.buffered() > 0);
  }

  StreamReader reader_;
  Serve serve_;
  Room room_;
  FrameHeaderBytes header_{};  // the frame being read
  enum class Wait { nothing, header, body } waiting_for_ = Wait::nothing;
};

}  // namespace psched
