// ShardListener: accepts connections for one shard and serves each with its own RPC system
// until the peer leaves. A connection that breaks (garbage, oversized frames, a dropped peer)
// is dropped alone; the shard keeps serving the others. KJ thread only.
#pragma once

#include <atomic>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "net/rpc_connection.h"
#include "net/shard_service.h"

namespace psched {

class ShardListener final : private kj::TaskSet::ErrorHandler {
 public:
  // `endpoint` outlives the listener.
  explicit ShardListener(ShardEndpoint& endpoint);

  // Accepts on `receiver` until the returned promise is dropped. A failed accept (out of file
  // descriptors, say) is logged and retried after a pause on `timer`; it never ends serving.
  // An accepted connection silent for limits.stall_timeout_seconds inside a message is dropped.
  kj::Promise<void> listen(kj::ConnectionReceiver& receiver, kj::Timer& timer);
  // Serves one already-open stream (tests use in-memory pipes); closes it at once when
  // limits.max_connections are open. A connection's unanswered calls may hold twice
  // limits.max_message_bytes plus 1 KiB per allowed waiting poll before the shard stops
  // reading from it.
  void serve(kj::Own<kj::AsyncIoStream> stream);
  // Open connections now; any thread may read it (the operator view does).
  size_t connections() const { return connections_.load(std::memory_order_relaxed); }

 private:
  void taskFailed(kj::Exception&& exception) override;

  ShardEndpoint& endpoint_;
  kj::TaskSet tasks_;
  std::atomic<size_t> connections_ = 0;  // written on the KJ thread only
};

}  // namespace psched
