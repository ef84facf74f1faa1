// SPDX-License-Identifier: Apache-2.0
// ShardListener: accepts connections for one shard and serves each with its own RPC system
// until the peer leaves. A connection that breaks (garbage, oversized frames, a dropped peer)
// is dropped alone; the shard keeps serving the others. With TLS, every connection first
// completes a TLS handshake; one that fails (a client without TLS) is dropped alone too. KJ
// thread only.
#pragma once

#include <atomic>

#include <kj/async-io.h>
#include <kj/compat/tls.h>
#include <kj/timer.h>

#include "common/result.h"
#include "net/rpc_connection.h"
#include "server/connection_admission.h"
#include "server/shard_service.h"

namespace psched {

class ShardListener final : private kj::TaskSet::ErrorHandler {
 public:
  // `endpoint`, and `tls` when given (net/tls.h server_tls_context), outlive the listener.
  explicit ShardListener(ShardEndpoint& endpoint, kj::TlsContext* tls = nullptr);

  // Accepts on `receiver` until the returned promise is dropped. A failed accept (out of file
  // descriptors, say) is logged and retried after a pause on `timer`; it never ends serving.
  // An accepted connection silent for limits.stall_timeout_seconds inside a message is dropped,
  // and one that has not completed `connect` within limits.auth_timeout_seconds is closed.
  kj::Promise<void> listen(kj::ConnectionReceiver& receiver, kj::Timer& timer);
  // Serves one already-open stream from `peer` (tests use in-memory pipes), after the TLS
  // handshake, as ConnectionAdmission (server/connection_admission.h) lets it. A connection's
  // unanswered calls may hold twice limits.max_message_bytes plus 1 KiB per allowed waiting
  // poll before the shard stops reading from it.
  void serve(kj::Own<kj::AsyncIoStream> stream, std::string peer = "a local stream");
  // Runs the deadlines above (stall, authentication) on `timer` for the streams served from
  // now on; without one (streams served without listen()) there are none. `timer` outlives
  // the listener.
  void use_timer(kj::Timer& timer) { timer_ = &timer; }
  // Open connections now, authenticated or not; any thread may read it (the operator view
  // does).
  size_t connections() const { return connections_.load(std::memory_order_relaxed); }

 private:
  // Tells a data stream (net/data_frame.h) from an RPC connection by its first bytes and
  // serves it as that; resolves when it ends.
  kj::Promise<void> serve_stream(kj::Own<kj::AsyncIoStream> stream,
                                 std::shared_ptr<ConnectionTicket> ticket);
  // A data stream, after its preface: checks the key it presents, then runs its DataSession.
  kj::Promise<void> serve_data(kj::Own<kj::AsyncIoStream> stream,
                               std::shared_ptr<ConnectionTicket> ticket);
  // The worker whose data stream `key` opens (good once), or the refusal, logged.
  Result<WorkerId> take_data_key(kj::ArrayPtr<const kj::byte> key, ConnectionTicket& ticket);
  // Answers a data stream's preface: ready (`refusal` empty) or the refusal.
  static kj::Promise<void> answer_preface(kj::AsyncIoStream& stream, const std::string& refusal);
  // The connection's life: resolves when it ends; the connection is attached.
  kj::Promise<void> serve_rpc(kj::Own<kj::AsyncIoStream> stream,
                              std::shared_ptr<ConnectionTicket> ticket);
  // Resolves when `ticket` has not authenticated limits.auth_timeout_seconds from now (never
  // without a timer: streams served without listen()).
  kj::Promise<void> auth_deadline(std::shared_ptr<ConnectionTicket> ticket);
  void taskFailed(kj::Exception&& exception) override;

  ShardEndpoint& endpoint_;
  kj::TlsContext* tls_;  // null: plain TCP
  ConnectionAdmission admission_;
  kj::Timer* timer_ = nullptr;  // runs the deadlines; see use_timer()
  kj::TaskSet tasks_;
  std::atomic<size_t> connections_ = 0;  // written on the KJ thread only
};

}  // namespace psched
