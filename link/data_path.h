// SPDX-License-Identifier: Apache-2.0
// DataPath: how one connection to a shard carries a worker's pushes and polls, chosen once when
// the connection opens (ShardLink): as Cap'n Proto calls (link/rpc_calls.h) or as frames of a
// data stream (link/data_channel.h). Both carry the same requests to the same shard-side core
// (server/data_plane.h). KJ thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <kj/async.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"

namespace psched {

// One partition on its way: its gradient goes up, its fresh value lands in `out`.
struct PartitionRequest {
  VariableId variable;  // the shard's id for it
  Step step;
  ElementRange range;
  DType dtype = DType::float32;
  // range.size() elements in `format`; sent from where it lies when the path can (the caller
  // keeps it alive and unchanged until the promise resolves or is dropped), else copied.
  std::span<const std::byte> gradient;
  // Room for range.size() elements. The caller keeps it alive until the promise resolves or is
  // dropped, and over a data stream while the connection lives: a value already arriving lands.
  std::byte* out = nullptr;
  WireFormat format = WireFormat::none;        // of `gradient` (compression/codec.h)
  WireFormat value_format = WireFormat::none;  // the fresh value travels in

  // The bytes of the range in the variable's dtype (what lands in `out`).
  size_t bytes() const { return range.size() * element_bytes(dtype); }
  // The bytes of the fresh value on the wire, in value_format.
  size_t value_bytes() const;
  // Writes an answered value (value_format) into `out`, widened; an error, and nothing written,
  // when it is not value_bytes() long.
  std::optional<Error> land(std::span<const std::byte> value) const;
};

// What became of one partition's request.
struct Outcome {
  std::optional<Error> error;  // none: receipted (push) or its value is in place (poll)
  int64_t applied_at_ns = 0;   // a value's: the shard's wall clock when it found it ready
};

class DataPath {
 public:
  virtual ~DataPath() = default;

  // Each of these sends its partitions now (one each), done with `parts`
  // when it returns (the memory they point to is another matter, above), and resolves with one
  // outcome each, in order; a refused partition changed nothing on the shard. They reject only
  // when the connection is lost ([disconnected]); the caller then resends what has no outcome.
  //
  // Pushes each gradient; the outcome is its receipt.
  virtual kj::Promise<std::vector<Outcome>> push(std::span<const PartitionRequest> parts) = 0;
  // The fresh value of each range once its step's update is applied. Dropping the promise
  // cancels the polls.
  virtual kj::Promise<std::vector<Outcome>> poll(std::span<const PartitionRequest> parts) = 0;
  // push() and poll() of the same ranges in one request each: the outcome is the value, or the
  // push's refusal.
  virtual kj::Promise<std::vector<Outcome>> push_poll(std::span<const PartitionRequest> parts) = 0;
};

}  // namespace psched
