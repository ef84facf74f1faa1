#include "net/shard_listener.h"

#include "common/log.h"

namespace psched {

ShardListener::ShardListener(ShardEndpoint& endpoint, kj::TlsContext* tls)
    : endpoint_(endpoint), tls_(tls), tasks_(*this) {}

kj::Promise<void> ShardListener::listen(kj::ConnectionReceiver& receiver, kj::Timer& timer) {
  return receiver.accept().then(
      [this, &receiver, &timer](kj::Own<kj::AsyncIoStream> stream) {
        serve(kj::mv(stream));
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
  if (!tls_) return serve_rpc(kj::mv(stream));
  tasks_.add(tls_->wrapServer(kj::mv(stream))
                 .then([this](kj::Own<kj::AsyncIoStream> secure) { serve_rpc(kj::mv(secure)); },
                       [this](kj::Exception&& e) {
                         log_warn("shard {}: TLS handshake failed, connection dropped: {}",
                                  endpoint_.id.value, e.getDescription().cStr());
                       }));
}

void ShardListener::serve_rpc(kj::Own<kj::AsyncIoStream> stream) {
  auto connection =
      kj::heap<RpcConnection>(kj::mv(stream), kj::heap<ShardService>(endpoint_),
                              reader_options(endpoint_.config.limits.max_message_bytes));
  ++connections_;
  auto done = connection->on_disconnect();
  tasks_.add(done.attach(kj::mv(connection))
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
