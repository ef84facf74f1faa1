// SPDX-License-Identifier: Apache-2.0
// RpcConnection: a two-party Cap'n Proto RPC system over one byte stream (a TCP connection or
// an in-memory pipe), with psched's message size limits. KJ thread only.
#pragma once

#include <functional>
#include <memory>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "net/write_coalescing.h"

namespace psched {

// Reader options for both ends: the traversal limit admits a payload of `max_message_bytes`
// with room to spare, so a shard can answer an oversized one with [message_too_large] instead
// of dropping the connection; twice over the limit the connection is dropped.
capnp::ReaderOptions reader_options(uint64_t max_message_bytes);

// `stream` with Nagle's algorithm off when it is a TCP socket: a small poll sent right behind a
// large push must not wait for the push's ACK. Other streams (in-memory pipes) pass unchanged.
kj::Own<kj::AsyncIoStream> without_nagle(kj::Own<kj::AsyncIoStream> stream);

class RpcConnection {
 public:
  // Server side: serves `bootstrap` to the peer.
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap,
                capnp::ReaderOptions options);
  // Client side: bootstrap() is the peer's capability. With `timer`, lone Finish messages wait
  // briefly for the next call to carry them (net/write_coalescing.h).
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::ReaderOptions options,
                kj::Timer* timer = nullptr);

  capnp::Capability::Client bootstrap();
  // Stops reading from the peer while its unanswered calls hold more than `bytes` (their
  // messages stay in memory until answered); reading resumes as answers go out.
  void limit_unanswered_calls(uint64_t bytes) { rpc_.setFlowLimit(bytes / sizeof(capnp::word)); }
  // Resolves when the peer disconnects (or the stream breaks) and what was written has left.
  kj::Promise<void> on_disconnect();
  // Bytes of messages queued to write and not yet written.
  uint64_t queued_bytes() { return network_.getCurrentQueueSize(); }
  // Calls `callback` (on this loop) each time a write to the peer completes.
  void on_written(std::function<void()> callback) { *written_ = std::move(callback); }

 private:
  // `stream` with Nagle off, a read buffer and write coalescing (kept in writes_), holding lone
  // Finish messages when given `finish_timer`.
  kj::Own<kj::AsyncIoStream> coalesced(kj::Own<kj::AsyncIoStream> stream,
                                       kj::Timer* finish_timer = nullptr);

  WriteCoalescingStream* writes_ = nullptr;  // inside stream_
  std::shared_ptr<std::function<void()>> written_ = std::make_shared<std::function<void()>>();
  kj::Own<kj::AsyncIoStream> stream_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
};

}  // namespace psched
