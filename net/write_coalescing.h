// SPDX-License-Identifier: Apache-2.0
// Write coalescing under a Cap'n Proto connection. KJ 0.9's RPC writes every message (each
// call, return and finish) with a syscall of its own once the previous write is done, and with
// Nagle off each becomes a packet the peer wakes for. Through this layer, small messages are
// copied into a buffer and written together when the loop is about to wait for I/O, or ahead of
// the next large message in the same writev; large messages are never copied.
#pragma once

#include <kj/async-io.h>

#include "net/forwarding_stream.h"

namespace psched {

class WriteCoalescingStream : public ForwardingStream {
 public:
  using ForwardingStream::ForwardingStream;
  // Resolves once every byte written so far has been handed to the stream underneath and
  // written there: a connection that closes waits for it, so its last answer (Cap'n Proto's
  // abort naming why) is not lost in the buffer.
  virtual kj::Promise<void> drained() = 0;
};

// Writes up to this size are gathered by default.
constexpr size_t kSmallWriteBytes = 16 * 1024;

// `stream` with writes of at most `small_bytes` gathered as above; reads pass through.
//
// With `finish_timer`, a Cap'n Proto Finish message (a caller telling the peer that it has the
// answer, which nothing waits for) written alone is held until the next write carries it, or
// kFinishHold has passed: a worker that pushes one partition at a time would otherwise wake its
// shard twice per round trip, once for the call and once for the call's Finish.
kj::Own<WriteCoalescingStream> with_write_coalescing(kj::Own<kj::AsyncIoStream> stream,
                                                     size_t small_bytes = kSmallWriteBytes,
                                                     kj::Timer* finish_timer = nullptr);

// How long a lone Finish waits for a write to carry it. Each wait that ends without one costs
// the worker's loop a timer wake-up: 1 ms cost eight sync-mode workers ~10% more CPU per byte
// than no hold (docs/benchmarks.md); 10 ms was level with none there.
constexpr kj::Duration kFinishHold = 10 * kj::MILLISECONDS;

}  // namespace psched
