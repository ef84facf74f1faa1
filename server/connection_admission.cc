// SPDX-License-Identifier: Apache-2.0
#include "server/connection_admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include <kj/async-io.h>

#include "common/error.h"
#include "common/log.h"

namespace psched {

bool RefusalLog::refused(std::string_view kind, std::string_view peer, std::string_view reason,
                         Clock::time_point now) {
  auto it = std::find_if(windows_.begin(), windows_.end(),
                         [&](const Window& w) { return w.kind == kind; });
  if (it == windows_.end()) it = windows_.insert(windows_.end(), Window{std::string(kind)});
  Window& w = *it;
  if (w.logged == 0 || now - w.start >= window_) {
    if (w.left_out > 0)
      log_warn("shard {}: {} more refusal(s) ({}) were not logged", shard_.value, w.left_out, kind);
    w.start = now;
    w.logged = 0;
    w.left_out = 0;
  }
  if (w.logged >= burst_) {
    ++w.left_out;
    return false;
  }
  ++w.logged;
  log_warn("shard {}: refused {}: {}", shard_.value, peer, reason);
  return true;
}

uint64_t RefusalLog::left_out(std::string_view kind) const {
  for (const Window& w : windows_)
    if (w.kind == kind) return w.left_out;
  return 0;
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
    refused("max_unauthenticated_connections", *oldest,
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
  admit(ticket, false,
        fmt::format("shard {} is at max_connections ({}, limits.max_connections); retry later",
                    address_, limits_.max_connections));
}

void ConnectionAdmission::join_session(ConnectionTicket& ticket) {
  admit(ticket, true,
        fmt::format("shard {} has max_connections ({}, limits.max_connections) data streams "
                    "open; retry later",
                    address_, limits_.max_connections));
}

void ConnectionAdmission::admit(ConnectionTicket& ticket, bool data_stream,
                                const std::string& when_full) {
  if (ticket.authenticated) return;
  uint64_t& count = data_stream ? data_streams_ : authenticated_;
  if (count >= limits_.max_connections) {
    Error error(ErrorCode::overloaded, when_full);
    refused("max_connections", ticket, error.what());
    throw error;
  }
  ticket.authenticated = true;
  ticket.data_stream = data_stream;
  ++count;
  if (ticket.waiting) {
    ticket.waiting = false;
    std::erase_if(waiting_, [&](const auto& t) { return t.get() == &ticket; });
  }
}

void ConnectionAdmission::closed(ConnectionTicket& ticket) {
  if (ticket.authenticated) {
    ticket.authenticated = false;
    --(ticket.data_stream ? data_streams_ : authenticated_);
  }
  if (ticket.waiting) {
    ticket.waiting = false;
    std::erase_if(waiting_, [&](const auto& t) { return t.get() == &ticket; });
  }
}

void ConnectionAdmission::refused(std::string_view kind, const ConnectionTicket& ticket,
                                  std::string_view reason) {
  log_.refused(kind, ticket.peer, reason, RefusalLog::Clock::now());
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
