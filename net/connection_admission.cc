#include "net/connection_admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include <kj/async-io.h>

#include "common/error.h"
#include "common/log.h"

namespace psched {

bool RefusalLog::refused(std::string_view peer, std::string_view reason, Clock::time_point now) {
  if (now - window_start_ >= window_) {
    if (left_out_ > 0)
      log_warn("shard {}: {} more refusal(s) were not logged in the last {} s", shard_.value,
               left_out_, std::chrono::duration_cast<std::chrono::seconds>(window_).count());
    window_start_ = now;
    logged_ = 0;
    left_out_ = 0;
  }
  if (logged_ >= burst_) {
    ++left_out_;
    return false;
  }
  ++logged_;
  log_warn("shard {}: refused {}: {}", shard_.value, peer, reason);
  return true;
}

ConnectionAdmission::ConnectionAdmission(ShardId shard, std::string address,
                                         const LimitsConfig& limits)
    : shard_(shard), address_(std::move(address)), limits_(limits), log_(shard) {}

std::shared_ptr<ConnectionTicket> ConnectionAdmission::open(
    std::string peer, kj::Own<kj::PromiseFulfiller<void>> close) {
  if (waiting_.size() >= limits_.max_unauthenticated_connections) {
    std::shared_ptr<ConnectionTicket> oldest = waiting_.front();
    waiting_.erase(waiting_.begin());
    oldest->waiting = false;
    refused(*oldest,
            fmt::format("closed: {} connections are waiting to authenticate, the limit "
                        "(limits.max_unauthenticated_connections), and this is the oldest",
                        limits_.max_unauthenticated_connections));
    oldest->close->fulfill();
  }
  auto ticket = std::make_shared<ConnectionTicket>();
  ticket->peer = std::move(peer);
  ticket->waiting = true;
  ticket->close = kj::mv(close);
  waiting_.push_back(ticket);
  return ticket;
}

void ConnectionAdmission::authenticate(ConnectionTicket& ticket) {
  if (ticket.authenticated) return;
  if (authenticated_ >= limits_.max_connections) {
    Error error(ErrorCode::overloaded,
                fmt::format("shard {} is at max_connections ({}, limits.max_connections); "
                            "retry later",
                            address_, limits_.max_connections));
    refused(ticket, error.what());
    throw error;
  }
  ticket.authenticated = true;
  ++authenticated_;
  if (ticket.waiting) {
    ticket.waiting = false;
    std::erase_if(waiting_, [&](const auto& t) { return t.get() == &ticket; });
  }
}

void ConnectionAdmission::closed(ConnectionTicket& ticket) {
  if (ticket.authenticated) {
    ticket.authenticated = false;
    --authenticated_;
  }
  if (ticket.waiting) {
    ticket.waiting = false;
    std::erase_if(waiting_, [&](const auto& t) { return t.get() == &ticket; });
  }
}

void ConnectionAdmission::refused(const ConnectionTicket& ticket, std::string_view reason) {
  log_.refused(ticket.peer, reason, RefusalLog::Clock::now());
}

std::string peer_name(kj::AsyncIoStream& stream) {
  sockaddr_storage address{};
  kj::uint length = sizeof address;
  try {
    stream.getpeername(reinterpret_cast<sockaddr*>(&address), &length);
  } catch (const kj::Exception&) {
    return "a local stream";
  }
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(in->sin6_port));
  }
  return "a local stream";
}

}  // namespace psched
