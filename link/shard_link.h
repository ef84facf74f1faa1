// SPDX-License-Identifier: Apache-2.0
// ShardLink: a worker's connection to one shard. It connects, registers and pulls with
// Cap'n Proto calls, each resolving with its answer or rejecting with the server's exception
// (use from_kj_exception to read it), and hands out the connection's DataPath
// (link/data_path.h), chosen once when the connection opens: a data stream when the link was
// built with one and the shard has them, else Cap'n Proto calls. KJ thread only.
//
// Reconnecting: a link built with a StreamOpener can recover() after a call failed with a
// lost connection: it opens a new stream, presents the same worker id and token, and
// registers again every part registered through it (a restarted shard that restored its
// checkpoint answers with the same ids). The caller then resends what was not answered; the
// shard recognises a resent push it already applied and acknowledges it without applying it
// again (actors/shard/variable.h), so each push is applied exactly once.
#pragma once

#include <exception>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kj/timer.h>

#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "common/placement.h"
#include "link/data_path.h"
#include "net/cluster_layout.h"
#include "net/psched.capnp.h"
#include "net/rpc_connection.h"

namespace psched {

// Opens a new byte stream to the shard (a TCP connection; an in-memory pipe in tests).
using StreamOpener = std::function<kj::Promise<kj::Own<kj::AsyncIoStream>>()>;

struct ReconnectPolicy {
  kj::Timer* timer = nullptr;                        // paces the retries
  kj::Duration timeout = 60 * kj::SECONDS;           // give up after trying this long
  kj::Duration first_delay = 50 * kj::MILLISECONDS;  // doubling up to max_delay between tries
  // Short: a shard that restarts, or moves to another server (docs/reliability.md), is back
  // within a second or two; a longer delay would be that much more time lost each time.
  kj::Duration max_delay = 250 * kj::MILLISECONDS;
};

class ShardLink {
 public:
  // A link that can reconnect: connect() opens the first stream. `address` names the shard in
  // messages. `max_message_bytes` sizes the reader (the shard's limit is learnt on connect).
  // With `data_stream`, each connection also opens a data stream (link/data_channel.h) that
  // carries pushes and polls; without one, or with a shard that has none, they go as Cap'n
  // Proto calls (link/rpc_calls.h). `plain_sockets`: `open` returns TCP sockets
  // themselves, with no TLS or wrapper over them (net/stream_reader.h).
  ShardLink(std::string address, StreamOpener open, uint64_t max_message_bytes,
            ReconnectPolicy policy, bool data_stream = true, bool plain_sockets = false);
  // A link over one stream that cannot reconnect (tests' hand-made clients).
  ShardLink(kj::Own<kj::AsyncIoStream> stream, uint64_t max_message_bytes);
  ~ShardLink();

  // Presents the worker's id and token; resolves with the shard's view of the cluster. A link
  // that can reconnect retries with back-off, for up to the policy's timeout, while the shard
  // refuses with [overloaded] (it is at limits.max_connections); any other failure rejects.
  kj::Promise<ClusterLayout> connect(WorkerId worker, const std::string& token);

  // Opens a data stream over `stream` beside the current connection (after connect()), for
  // links over one stream (tests' hand-made clients); later calls use it.
  kj::Promise<void> open_data_stream(kj::Own<kj::AsyncIoStream> stream);
  // The current connection's way of carrying pushes and polls; null before connect()
  // succeeded. Valid while the connection lives: keep hold() with a call in flight.
  DataPath* data_path();
  // Keeps the current connection open while it is kept (a lost one is closed once its calls
  // are done). Requires data_path() != null.
  kj::Own<void> hold();
  // Whether the current connection carries them over a data stream (else as RPC calls).
  bool has_data_stream();

  // Counts the connections this link has opened; a call started on connection `epoch()`
  // that failed with a lost connection passes it to recover().
  uint64_t epoch() const { return epoch_; }
  // Reconnects after connection `failed_epoch` was lost; resolves at once when that already
  // happened. Concurrent callers share one attempt. Rejects with [disconnected] naming the
  // shard when it stays unreachable for the policy's timeout, or with the shard's error when
  // it refuses the worker (a wrong token, a variable it no longer knows), and with
  // [bad_config] when the shard that answers is not the one the first connection reached
  // (another shard index, job, slot map or deployment: net/cluster_layout.h shard_change).
  // `why`: what the call failed with, for the log.
  kj::Promise<void> recover(uint64_t failed_epoch, std::string_view why = {});
  const std::string& address() const { return address_; }
  // The address messages name from now on: the link's opener reached the shard at another one
  // (a shard restarted elsewhere, client/client.h ClientOptions::deployment_file).
  void set_address(std::string address) { address_ = std::move(address); }
  // Registers `part` of the variable; `initial` holds part.size() elements and is only read
  // while the call is built. Resolves with the shard's id for it.
  kj::Promise<VariableId> register_part(const VariableSpec& spec, bool use_server_optimizer,
                                        ElementRange part, std::span<const std::byte> initial);
  // Registers embedding table `spec`, of which the shard holds the rows placement gives it.
  // Resolves with the shard's id for it.
  kj::Promise<VariableId> register_table(const TableSpec& spec);
  // The current value of `range`, copied into `out`; with `after`, once `after`'s update of it
  // is applied (a poll: the job's update in sync mode, this worker's in async mode).
  kj::Promise<void> pull(VariableId variable, ElementRange range, std::byte* out, size_t out_bytes,
                         Step after = Step());
  // The step from which this worker, a process that starts, takes part, at least `at_least`
  // (Session.join in net/psched.capnp).
  kj::Promise<Step> join(Step at_least);

 private:
  struct Connection;
  // A part registered through this link, registered again after a reconnect.
  struct Registered {
    VariableSpec spec;
    bool use_server_optimizer;
    ElementRange part;
    std::span<const std::byte> value;  // the trainer's memory (alive as long as the worker)
    VariableId id;
  };

  struct Registration {
    VariableId id;
    bool created = false;
  };

  // The current connection's session, or null before connect() succeeded.
  wire::Session::Client* session();
  // A rejection saying the session is not open.
  static kj::Exception not_connected();
  // Presents the worker on `connection`; resolves with the shard's layout.
  kj::Promise<ClusterLayout> present(Connection& connection);
  kj::Promise<Registration> send_register(Connection& connection, const Registered& part);
  kj::Promise<Registration> send_register_table(Connection& connection, const TableSpec& spec);
  // One attempt: a new connection, presented and with every part registered so far registered
  // again, becomes current; resolves with the shard's layout.
  kj::Promise<ClusterLayout> open_connection();
  // open_connection() again, `delay` apart (doubling up to max_delay) until `deadline`, while
  // the shard is full ([overloaded]) and, when `reconnecting`, while it is unreachable.
  kj::Promise<ClusterLayout> connect_with_retries(kj::TimePoint deadline, kj::Duration delay,
                                                  bool reconnecting);
  kj::Promise<void> register_again(Connection& connection);
  // Opens `connection`'s data stream with `open`, unless the shard has no data streams.
  kj::Promise<void> open_data(Connection& connection, StreamOpener open);

  std::string address_;
  StreamOpener open_;
  uint64_t max_message_bytes_;
  ReconnectPolicy policy_;
  bool data_stream_ = false;
  bool plain_sockets_ = false;
  WorkerId worker_;
  std::string token_;
  kj::Own<Connection> connection_;  // the current one (calls in flight hold theirs)
  std::vector<Registered> registered_;
  std::vector<std::pair<TableSpec, VariableId>> tables_;  // registered through this link
  uint64_t epoch_ = 0;
  kj::Maybe<ClusterLayout> layout_;     // the first connection's: what a reconnection must match
  bool attempt_reached_shard_ = false;  // the last open_connection() opened its stream
  bool recovering_now_ = false;
  kj::Maybe<kj::ForkedPromise<void>> recovering_;
};

}  // namespace psched
