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

// `stream` with writes of at most `small_bytes` gathered as above; reads pass through.
kj::Own<WriteCoalescingStream> with_write_coalescing(kj::Own<kj::AsyncIoStream> stream,
                                                     size_t small_bytes = 16 * 1024);

}  // namespace psched
