// SPDX-License-Identifier: Apache-2.0
// ShardLink: a worker's connection to one shard. Each method starts one call and resolves
// with its answer or rejects with the server's exception (use from_kj_exception to read it).
// KJ thread only.
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
#include <vector>

#include <kj/timer.h>

#include "actors/shard/variable_spec.h"
#include "common/placement.h"
#include "link/data_channel.h"
#include "net/cluster_layout.h"
#include "net/psched.capnp.h"
#include "net/rpc_connection.h"

namespace psched {

// One partition of a fused push and poll: its gradient goes up, its fresh value lands in `out`.
struct FusedPartition {
  VariableId variable;
  Step step;
  ElementRange range;
  DType dtype = DType::float32;
  std::span<const std::byte> gradient;  // range.size() elements, copied into the message
  std::byte* out = nullptr;             // room for range.size() elements
};

// What a poll found: the shard's wall clock (ns since the Unix epoch) when the value was ready.
struct PollOutcome {
  std::exception_ptr error;  // null: the value is in place
  int64_t applied_at_ns = 0;
};

// Opens a new byte stream to the shard (a TCP connection; an in-memory pipe in tests).
using StreamOpener = std::function<kj::Promise<kj::Own<kj::AsyncIoStream>>()>;

struct ReconnectPolicy {
  kj::Timer* timer = nullptr;                        // paces the retries
  kj::Duration timeout = 60 * kj::SECONDS;           // give up after trying this long
  kj::Duration first_delay = 50 * kj::MILLISECONDS;  // doubling up to max_delay between tries
  kj::Duration max_delay = 2 * kj::SECONDS;
};

class ShardLink {
 public:
  // A link that can reconnect: connect() opens the first stream. `address` names the shard in
  // messages. `max_message_bytes` sizes the reader (the shard's limit is learnt on connect).
  // With `data_stream`, each connection also opens a data stream (link/data_channel.h) that
  // carries push, poll and pushPoll (fused ones as several frames); without one, or with a
  // shard that has none, they go as RPC calls. `plain_sockets`: `open` returns TCP sockets
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
  // Whether push, poll and pushPoll go over a data stream now (else as RPC calls).
  bool has_data_stream() { return data() != nullptr; }

  // Counts the connections this link has opened; a call started on connection `epoch()`
  // that failed with a lost connection passes it to recover().
  uint64_t epoch() const { return epoch_; }
  // Reconnects after connection `failed_epoch` was lost; resolves at once when that already
  // happened. Concurrent callers share one attempt. Rejects with [disconnected] naming the
  // shard when it stays unreachable for the policy's timeout, or with the shard's error when
  // it refuses the worker (a wrong token, a variable it no longer knows).
  kj::Promise<void> recover(uint64_t failed_epoch);
  const std::string& address() const { return address_; }
  // Registers `part` of the variable; `initial` holds part.size() elements and is only read
  // while the call is built. Resolves with the shard's id for it.
  kj::Promise<VariableId> register_part(const VariableSpec& spec, bool use_server_optimizer,
                                        ElementRange part, std::span<const std::byte> initial);
  // Pushes one partition. `gradient` is sent from where it lies when word-aligned (else
  // copied): the caller keeps it alive and unchanged until the promise resolves or is dropped.
  kj::Promise<void> push(VariableId variable, Step step, ElementRange range, DType dtype,
                         std::span<const std::byte> gradient);
  // The fresh value of `range` after `step`, copied into `out` (range.size() elements; the
  // caller keeps it alive until the promise resolves or is dropped, and over a data stream
  // while the link lives: a value already arriving still lands). Resolves with the shard's
  // wall-clock time of the answer.
  kj::Promise<int64_t> poll(VariableId variable, Step step, ElementRange range, std::byte* out,
                            size_t out_bytes);
  // Pushes several partitions in one message; resolves with one outcome per partition (null:
  // accepted), in order. Rejects only when the whole call failed (e.g. disconnected).
  kj::Promise<std::vector<std::exception_ptr>> push_fused(std::span<const FusedPartition> parts);
  // Polls several partitions in one message; each fresh value lands in its `out`, which the
  // caller keeps alive until the promise resolves or is dropped.
  kj::Promise<std::vector<PollOutcome>> poll_fused(std::span<const FusedPartition> parts);
  // push() and poll() of the same range in one call (async mode: half the messages). Rejects
  // with the push's refusal, or resolves as poll() does.
  kj::Promise<int64_t> push_poll(VariableId variable, Step step, ElementRange range, DType dtype,
                                 std::span<const std::byte> gradient, std::byte* out,
                                 size_t out_bytes);
  // push_fused() and poll_fused() in one call; a partition's refused push is its outcome's error.
  kj::Promise<std::vector<PollOutcome>> push_poll_fused(std::span<const FusedPartition> parts);
  // The current value of `range`, copied into `out`.
  kj::Promise<void> pull(VariableId variable, ElementRange range, std::byte* out, size_t out_bytes);

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
  // The current connection's data stream, or null.
  DataChannel* data();

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
  uint64_t epoch_ = 0;
  bool recovering_now_ = false;
  kj::Maybe<kj::ForkedPromise<void>> recovering_;
};

}  // namespace psched
