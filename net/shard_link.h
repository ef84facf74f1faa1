// ShardLink: a worker's connection to one shard. Each method starts one call and resolves
// with its answer or rejects with the server's exception (use from_kj_exception to read it).
// KJ thread only.
#pragma once

#include <exception>
#include <span>
#include <string>
#include <vector>

#include "actors/variable_spec.h"
#include "common/placement.h"
#include "net/cluster_layout.h"
#include "net/psched.capnp.h"
#include "net/rpc_connection.h"

namespace psched {

// One partition of a fused push and poll: its gradient goes up, its fresh value lands in `out`.
struct FusedPartition {
  VariableId variable;
  Step step = 0;
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

class ShardLink {
 public:
  // `max_message_bytes` sizes the reader (the shard's limit is learnt on connect).
  ShardLink(kj::Own<kj::AsyncIoStream> stream, uint64_t max_message_bytes);

  // Presents the worker's id and token; resolves with the shard's view of the cluster.
  kj::Promise<ClusterLayout> connect(WorkerId worker, const std::string& token);
  // Registers `part` of the variable; `initial` holds part.size() elements and is only read
  // while the call is built. Resolves with the shard's id for it.
  kj::Promise<VariableId> register_part(const VariableSpec& spec, bool use_server_optimizer,
                                        ElementRange part, std::span<const std::byte> initial);
  // Pushes one partition. `gradient` is sent from where it lies when word-aligned (else
  // copied): the caller keeps it alive and unchanged until the promise resolves or is dropped.
  kj::Promise<void> push(VariableId variable, Step step, ElementRange range, DType dtype,
                         std::span<const std::byte> gradient);
  // The fresh value of `range` after `step`, copied into `out` (range.size() elements; the
  // caller keeps it alive until the promise resolves or is dropped). Resolves with the shard's
  // wall-clock time of the answer.
  kj::Promise<int64_t> poll(VariableId variable, Step step, ElementRange range, std::byte* out,
                            size_t out_bytes);
  // Pushes several partitions in one message; resolves with one outcome per partition (null:
  // accepted), in order. Rejects only when the whole call failed (e.g. disconnected).
  kj::Promise<std::vector<std::exception_ptr>> push_fused(std::span<const FusedPartition> parts);
  // Polls several partitions in one message; each fresh value lands in its `out`, which the
  // caller keeps alive until the promise resolves or is dropped.
  kj::Promise<std::vector<PollOutcome>> poll_fused(std::span<const FusedPartition> parts);
  // The current value of `range`, copied into `out`.
  kj::Promise<void> pull(VariableId variable, ElementRange range, std::byte* out, size_t out_bytes);

  kj::Promise<void> on_disconnect() { return connection_.on_disconnect(); }

 private:
  // The session, or null before connect() succeeded.
  wire::Session::Client* session();
  // A rejection saying the session is not open.
  static kj::Exception not_connected();

  RpcConnection connection_;
  wire::Shard::Client shard_;
  kj::Maybe<wire::Session::Client> session_;
};

}  // namespace psched
