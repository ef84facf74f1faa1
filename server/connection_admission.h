// SPDX-License-Identifier: Apache-2.0
// ConnectionAdmission: which connections to one shard get in, and how long one may stay
// before it authenticates (completes `connect` with the right token). KJ thread only.
//
//   - at most limits.max_unauthenticated_connections wait to authenticate; one more closes the
//     oldest waiting one (sshd's MaxStartups drops unauthenticated connections likewise), so
//     idle or slow connections can never take the slots a worker needs;
//   - one that has not authenticated limits.auth_timeout_seconds after it opened is closed
//     (PostgreSQL's authentication_timeout; ShardListener runs the clock);
//   - at most limits.max_connections are authenticated; one more `connect` is refused with
//     [overloaded] naming the shard and the limit, and the worker retries (link/shard_link.h).
//
// Every refusal is logged with the peer's address and the reason, through a RefusalLog, so a
// flood cannot fill the disk.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kj/async-io.h>

#include "common/types.h"
#include "config/deployment.h"

namespace psched {

// Logs refusals, at most `burst` lines per `window` for each kind of refusal (so a flood of one
// kind hides no other); the first line of a later window says how many were left out. Times
// are passed in, so tests choose them.
class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RefusalLog(ShardId shard, uint64_t burst = 20,
                      Clock::duration window = std::chrono::seconds(10))
      : shard_(shard), burst_(burst), window_(window) {}
  // Logs "shard N: refused PEER: REASON" unless `burst` lines of `kind` (a constant naming
  // the limit or check) went out in this window. Returns whether it logged.
  bool refused(std::string_view kind, std::string_view peer, std::string_view reason,
               Clock::time_point now);
  // Refusals of `kind` left out in its current window, so far.
  uint64_t left_out(std::string_view kind) const;

 private:
  struct Window {
    std::string kind;
    Clock::time_point start{};
    uint64_t logged = 0;
    uint64_t left_out = 0;
  };
  ShardId shard_;
  uint64_t burst_;
  Clock::duration window_;
  std::vector<Window> windows_;  // one per kind seen (a handful)
};

// One connection's standing. Shared by the listener's task for the connection and its
// ShardService.
struct ConnectionTicket {
  std::string peer;  // "address:port", for log lines
  bool authenticated = false;
  bool data_stream = false;  // an authenticated session's data stream (counted apart)
  bool waiting = false;      // counted among the connections waiting to authenticate
  // Fulfilled to close the connection (it was the oldest waiting when the budget was full).
  kj::Own<kj::PromiseFulfiller<void>> close;
};

class ConnectionAdmission {
 public:
  // `address` names the shard in refusals; `limits` outlives the admission.
  ConnectionAdmission(ShardId shard, std::string address, const LimitsConfig& limits);

  // A new connection from `peer`, closed by fulfilling `close`. When the waiting budget is
  // full, closes the oldest waiting connection first (logged).
  std::shared_ptr<ConnectionTicket> open(std::string peer,
                                         kj::Own<kj::PromiseFulfiller<void>> close);
  // The connection completed `connect`. Throws Error(overloaded) "shard ADDR is at
  // max_connections (N)" (and logs it) when that many are authenticated already; the
  // connection stays waiting then. Authenticating twice counts once.
  void authenticate(ConnectionTicket& ticket);
  // The connection is the data stream of an authenticated session (server/data_session.h):
  // it no longer waits, and counts among the data streams, not the sessions. Throws
  // Error(overloaded) (and logs it) when max_connections data streams are open already.
  void join_session(ConnectionTicket& ticket);
  // The connection is gone (closed by either side).
  void closed(ConnectionTicket& ticket);
  // Logs that `ticket`'s peer was refused for `reason` (rate-limited per `kind`).
  void refused(std::string_view kind, const ConnectionTicket& ticket, std::string_view reason);

  uint64_t authenticated() const { return authenticated_; }
  uint64_t waiting() const { return waiting_.size(); }

 private:
  // Counts the ticket among the data streams or the sessions, unless max_connections are
  // counted there already: then logs and throws Error(overloaded) with `when_full`.
  void admit(ConnectionTicket& ticket, bool data_stream, const std::string& when_full);

  ShardId shard_;
  std::string address_;
  const LimitsConfig& limits_;
  std::vector<std::shared_ptr<ConnectionTicket>> waiting_;  // oldest first
  uint64_t authenticated_ = 0;
  uint64_t data_streams_ = 0;
  RefusalLog log_;
};

// "address:port" of the stream's peer, or "a local stream" where it has none (a pipe).
std::string peer_name(kj::AsyncIoStream& stream);

}  // namespace psched
