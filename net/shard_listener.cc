#include "net/shard_listener.h"

#include "common/log.h"
#include "net/frame_deadline.h"

namespace psched {
namespace {

// More than a poll message takes per range it asks for. Waiting polls never fill the budget
// for unanswered calls, so the shard keeps reading the pushes that will answer them.
constexpr uint64_t kPollMessageBytes = 1024;

}  // namespace

ShardListener::ShardListener(ShardEndpoint& endpoint, kj::TlsContext* tls)
    : endpoint_(endpoint), tls_(tls), tasks_(*this) {}

kj::Promise<void> ShardListener::listen(kj::ConnectionReceiver& receiver, kj::Timer& timer) {
  return receiver.accept().then(
      [this, &receiver, &timer](kj::Own<kj::AsyncIoStream> stream) {
        kj::Duration stall = endpoint_.config.limits.stall_timeout_seconds * kj::SECONDS;
        serve(with_frame_deadline(kj::mv(stream), timer, stall));
        return listen(receiver, timer);
      },
      [this, &receiver, &timer](kj::Exception&& e) {
        log_warn("shard {}: accept failed, retrying in 100 ms: {}", endpoint_.id.value,
                 e.getDescription().cStr());
        return timer.afterDelay(100 * kj::MILLISECONDS).then([this, &receiver, &timer] {
          return listen(receiver, timer);
        });
      });
}

void ShardListener::serve(kj::Own<kj::AsyncIoStream> stream) {
  const LimitsConfig& limits = endpoint_.config.limits;
  if (connections() >= limits.max_connections) {
    log_warn("shard {}: connection closed: {} are open, the limit (limits.max_connections)",
             endpoint_.id.value, connections());
    return;  // dropping the stream closes it
  }
  if (!tls_) return serve_rpc(kj::mv(stream));
  tasks_.add(tls_->wrapServer(kj::mv(stream))
                 .then([this](kj::Own<kj::AsyncIoStream> secure) { serve_rpc(kj::mv(secure)); },
                       [this](kj::Exception&& e) {
                         log_warn("shard {}: TLS handshake failed, connection dropped: {}",
                                  endpoint_.id.value, e.getDescription().cStr());
                       }));
}

void ShardListener::serve_rpc(kj::Own<kj::AsyncIoStream> stream) {
  const LimitsConfig& limits = endpoint_.config.limits;
  auto order = kj::refcounted<AnswerOrder>();
  auto connection =
      kj::heap<RpcConnection>(kj::mv(stream), kj::heap<ShardService>(endpoint_, kj::addRef(*order)),
                              reader_options(limits.max_message_bytes));
  order->serve(*connection);
  connection->limit_unanswered_calls(2 * limits.max_message_bytes +
                                     kPollMessageBytes * limits.max_waiting_polls);
  ++connections_;
  auto done = connection->on_disconnect();
  // The order closes before the connection goes.
  auto close_order = kj::defer([order = kj::mv(order)]() mutable { order->close(); });
  tasks_.add(done.attach(kj::mv(close_order))
                 .attach(kj::mv(connection))
                 .then([this] { --connections_; },
                       [this](kj::Exception&& e) {
                         --connections_;
                         log_info("shard {}: connection dropped: {}", endpoint_.id.value,
                                  e.getDescription().cStr());
                       }));
}

void ShardListener::taskFailed(kj::Exception&& exception) {
  log_error("shard {}: {}", endpoint_.id.value, exception.getDescription().cStr());
}

}  // namespace psched
