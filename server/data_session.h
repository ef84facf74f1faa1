// SPDX-License-Identifier: Apache-2.0
// DataSession: the data stream's front end (net/data_frame.h) for one worker, on the shard's
// loop. It reads request frames (FrameReader), decodes each into a Request for the worker's
// DataPlane (server/data_plane.h), which does the rest, and writes the plane's answers as
// frames (FrameWriter), each value's bytes taken from the variable's memory as they leave. A
// push's gradient is read into a reused buffer and applied straight from it.
//
// Bad input is answered by the plane with an error naming what was wrong, and the stream goes
// on. A frame that cannot be skipped (an unknown kind, a body over the message limit) is
// answered, then the stream is closed. Other workers are not affected either way.
#pragma once

#include <memory>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "net/frame_reader.h"
#include "net/frame_writer.h"
#include "server/data_plane.h"

namespace psched {

class DataSession final : private AnswerWriter {
 public:
  // Serves `worker` on `stream`, for `endpoint`'s shard (which outlives the session). With a
  // `timer`, a worker silent for limits.stall_timeout_seconds inside a frame is dropped.
  // `plain_socket`: `stream` is the TCP socket itself, not TLS over it (net/stream_reader.h).
  DataSession(ShardEndpoint& endpoint, WorkerId worker, kj::Own<kj::AsyncIoStream> stream,
              kj::Timer* timer, bool plain_socket);
  DataSession(const DataSession&) = delete;
  DataSession& operator=(const DataSession&) = delete;

  // Serves frames until the worker closes the stream (resolves) or breaks it (rejects). The
  // session outlives the promise; dropping it stops serving and withdraws waiting polls.
  kj::Promise<void> run();

 private:
  // Serves the frame whose header was just read (FrameReader::Serve).
  kj::Maybe<kj::Promise<void>> serve_frame(const FrameHeaderBytes& header);
  // Reads a push's gradient, then hands the push to the plane.
  kj::Maybe<kj::Promise<void>> read_push(const RequestHeader& header);
  // A push or pull of rows: the body holds the ids, then (a push) their gradient rows.
  kj::Maybe<kj::Promise<void>> read_rows(const RequestHeader& header);
  // Reads the frame's `bytes` of body into `body` (the request's own buffer), then hands
  // `request` to the plane; null when the body was there already.
  kj::Maybe<kj::Promise<void>> serve_after_body(Request request, std::byte* body, uint64_t bytes);
  // Answers `id` with `error`, then ends the stream: the frame cannot be skipped.
  kj::Promise<void> close_with(uint64_t id, Error error);

  // AnswerWriter: answers go to the next write while fewer than kBatchBytes wait for it and no
  // write is in flight; a better answer ready meanwhile waits for no more than that.
  static constexpr uint64_t kBatchBytes = 256 * 1024;
  bool has_room() override;
  void take(Answer& answer) override;
  void send() override { writer_.flush_now(); }
  kj::Promise<void> written() override { return writer_.drained(); }

  ShardEndpoint& endpoint_;
  kj::Timer* timer_;
  kj::Own<kj::AsyncIoStream> stream_;
  FrameReader reader_;  // of stream_
  FrameWriter writer_;  // to stream_
  kj::Own<kj::PromiseFulfiller<void>> broken_;
  std::shared_ptr<DataPlane> plane_;  // last: it withdraws its polls first
};

}  // namespace psched
