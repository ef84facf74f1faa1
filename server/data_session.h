// SPDX-License-Identifier: Apache-2.0
// DataSession: serves one worker's data stream (net/data_frame.h) on the shard's loop. Each
// request frame is checked and handed to the shard as a direct call, its gradient applied
// straight from the buffer it was read into. Answers wait here and leave best first: receipts
// and errors, then values by priority (the layers nearest the input first), several to one
// write, each value's bytes taken from the variable's memory as they leave.
//
// Bad input is answered with an error naming what was wrong and changes nothing; the stream
// goes on. A frame that cannot be skipped (an unknown kind, a body over the message limit) is
// answered, then the stream is closed. Other workers are not affected either way.
#pragma once

#include <memory>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "server/shard_service.h"

namespace psched {

class DataSession {
 public:
  // Serves `worker` on `stream`, for `endpoint`'s shard (which outlives the session). With a
  // `timer`, a worker silent for limits.stall_timeout_seconds inside a frame is dropped.
  // `plain_socket`: `stream` is the TCP socket itself, not TLS over it (net/stream_reader.h).
  DataSession(ShardEndpoint& endpoint, WorkerId worker, kj::Own<kj::AsyncIoStream> stream,
              kj::Timer* timer, bool plain_socket);
  ~DataSession();
  DataSession(const DataSession&) = delete;
  DataSession& operator=(const DataSession&) = delete;

  // Serves frames until the worker closes the stream (resolves) or breaks it (rejects). The
  // session outlives the promise; dropping it stops serving and withdraws waiting polls.
  kj::Promise<void> run();

 private:
  class Core;
  std::shared_ptr<Core> core_;  // the shard's replies hold it weakly
};

}  // namespace psched
