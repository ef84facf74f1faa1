// SPDX-License-Identifier: Apache-2.0
#include "server/shard_listener.h"

#include <cstring>

#include "common/kj_error.h"
#include "common/log.h"
#include "common/result.h"
#include "net/data_frame.h"
#include "net/frame_deadline.h"
#include "net/prefixed_stream.h"
#include "server/data_session.h"

namespace psched {
namespace {

// More than a poll message takes per range it asks for. Waiting polls never fill the budget
// for unanswered calls, so the shard keeps reading the pushes that will answer them.
constexpr uint64_t kPollMessageBytes = 1024;

}  // namespace

ShardListener::ShardListener(ShardEndpoint& endpoint, kj::TlsContext* tls)
    : endpoint_(endpoint),
      tls_(tls),
      admission_(endpoint.id,
                 endpoint.id.value < endpoint.config.shards.size()
                     ? endpoint.config.shards[endpoint.id.value].listen.to_string()
                     : fmt::format("{}", endpoint.id.value),
                 endpoint.config.limits),
      tasks_(*this) {}

kj::Promise<void> ShardListener::listen(kj::ConnectionReceiver& receiver, kj::Timer& timer) {
  use_timer(timer);
  return receiver.accept().then(
      [this, &receiver, &timer](kj::Own<kj::AsyncIoStream> stream) {
        std::string peer = peer_name(*stream);
        serve(kj::mv(stream), kj::mv(peer));
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

void ShardListener::serve(kj::Own<kj::AsyncIoStream> stream, std::string peer) {
  auto closing = kj::newPromiseAndFulfiller<void>();
  auto ticket = admission_.open(kj::mv(peer), kj::mv(closing.fulfiller));
  ++connections_;
  kj::Promise<void> life = nullptr;
  if (!tls_) {
    life = serve_stream(kj::mv(stream), ticket);
  } else {
    life = tls_->wrapServer(kj::mv(stream))
               .then(
                   [this, ticket](kj::Own<kj::AsyncIoStream> secure) {
                     return serve_stream(kj::mv(secure), ticket);
                   },
                   [this](kj::Exception&& e) -> kj::Promise<void> {
                     log_warn("shard {}: TLS handshake failed, connection dropped: {}",
                              endpoint_.id.value, e.getDescription().cStr());
                     return kj::READY_NOW;
                   });
  }
  // Whichever comes first ends the connection (dropping `life` closes it).
  tasks_.add(life.exclusiveJoin(kj::mv(closing.promise))
                 .exclusiveJoin(auth_deadline(ticket))
                 .attach(kj::defer([this, ticket] {
                   admission_.closed(*ticket);
                   --connections_;
                 })));
}

kj::Promise<void> ShardListener::auth_deadline(std::shared_ptr<ConnectionTicket> ticket) {
  if (timer_ == nullptr) return kj::NEVER_DONE;
  uint64_t seconds = endpoint_.config.limits.auth_timeout_seconds;
  return timer_->afterDelay(seconds * kj::SECONDS)
      .then([this, ticket, seconds]() -> kj::Promise<void> {
        if (ticket->authenticated) return kj::NEVER_DONE;
        admission_.refused("auth_timeout_seconds", *ticket,
                           fmt::format("closed: no successful connect within {} s "
                                       "(limits.auth_timeout_seconds)",
                                       seconds));
        return kj::READY_NOW;
      });
}

kj::Promise<void> ShardListener::serve_stream(kj::Own<kj::AsyncIoStream> stream,
                                              std::shared_ptr<ConnectionTicket> ticket) {
  auto first = kj::heapArray<kj::byte>(kDataPreface.size());
  auto read = stream->tryRead(first.begin(), first.size(), first.size());
  return read.then([this, stream = kj::mv(stream), first = kj::mv(first),
                    ticket](size_t n) mutable -> kj::Promise<void> {
    if (n == first.size() && std::memcmp(first.begin(), kDataPreface.data(), n) == 0)
      return serve_data(kj::mv(stream), kj::mv(ticket));
    auto rpc = with_prefix(kj::mv(stream), kj::heapArray<kj::byte>(first.slice(0, n)));
    if (timer_ != nullptr) {
      // On the plain bytes (after TLS, with the sniffed prefix): the tracker follows
      // Cap'n Proto's framing. A data stream watches its own frames (DataSession).
      kj::Duration stall = endpoint_.config.limits.stall_timeout_seconds * kj::SECONDS;
      rpc = with_frame_deadline(kj::mv(rpc), *timer_, stall);
    }
    return serve_rpc(kj::mv(rpc), kj::mv(ticket));
  });
}

kj::Promise<void> ShardListener::serve_data(kj::Own<kj::AsyncIoStream> stream,
                                            std::shared_ptr<ConnectionTicket> ticket) {
  auto key = kj::heapArray<kj::byte>(kDataKeyBytes);
  auto read = stream->read(key.begin(), key.size());
  return read.then(
      [this, stream = kj::mv(stream), key = kj::mv(key), ticket]() mutable -> kj::Promise<void> {
        Result<WorkerId> worker = take_data_key(key, *ticket);
        auto written = answer_preface(*stream, worker ? std::string() : describe(worker.error()));
        if (!worker) return written.attach(kj::mv(stream));
        auto session =
            kj::heap<DataSession>(endpoint_, *worker, kj::mv(stream), timer_, tls_ == nullptr);
        DataSession& serving = *session;
        return written.then([&serving] { return serving.run(); })
            .attach(kj::mv(session))
            .catch_([this](kj::Exception&& e) {
              log_info("shard {}: data stream dropped: {}", endpoint_.id.value,
                       e.getDescription().cStr());
            });
      });
}

Result<WorkerId> ShardListener::take_data_key(kj::ArrayPtr<const kj::byte> key,
                                              ConnectionTicket& ticket) {
  return attempt([&] {
    auto found = endpoint_.data_keys.find(std::string(key.asChars().begin(), key.size()));
    if (found == endpoint_.data_keys.end()) {
      Error unknown(ErrorCode::bad_token,
                    "data stream refused: its key is unknown or used (ask the session for one: "
                    "openDataStream)");
      admission_.refused("data stream", ticket, unknown.what());
      throw unknown;
    }
    WorkerId worker = found->second;
    endpoint_.data_keys.erase(found);
    admission_.join_session(ticket);  // logs its own refusal
    return worker;
  });
}

kj::Promise<void> ShardListener::answer_preface(kj::AsyncIoStream& stream,
                                                const std::string& refusal) {
  AnswerHeader answer{refusal.empty() ? wire::AnswerKind::READY : wire::AnswerKind::ERROR, 0, 0, 0,
                      refusal.size()};
  auto reply = kj::heap<std::pair<FrameHeaderBytes, std::string>>(encode(answer), refusal);
  auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(
      {{reinterpret_cast<const kj::byte*>(reply->first.data()), reply->first.size()},
       {reinterpret_cast<const kj::byte*>(reply->second.data()), reply->second.size()}});
  return stream.write(pieces).attach(kj::mv(pieces), kj::mv(reply));
}

kj::Promise<void> ShardListener::serve_rpc(kj::Own<kj::AsyncIoStream> stream,
                                           std::shared_ptr<ConnectionTicket> ticket) {
  const LimitsConfig& limits = endpoint_.config.limits;
  auto window = kj::refcounted<ReturnWindow>();
  auto connection = kj::heap<RpcConnection>(
      kj::mv(stream),
      kj::heap<ShardService>(endpoint_, kj::addRef(*window), &admission_, kj::mv(ticket)),
      reader_options(limits.max_message_bytes));
  window->serve(*connection);
  connection->limit_unanswered_calls(2 * limits.max_message_bytes +
                                     kPollMessageBytes * limits.max_waiting_polls);
  auto done = connection->on_disconnect();
  // The window closes before the connection goes.
  auto close_window = kj::defer([window = kj::mv(window)]() mutable { window->close(); });
  return done.attach(kj::mv(close_window))
      .attach(kj::mv(connection))
      .catch_([this](kj::Exception&& e) {
        log_info("shard {}: connection dropped: {}", endpoint_.id.value, e.getDescription().cStr());
      });
}

void ShardListener::taskFailed(kj::Exception&& exception) {
  log_error("shard {}: {}", endpoint_.id.value, exception.getDescription().cStr());
}

}  // namespace psched
