// SPDX-License-Identifier: Apache-2.0
// FrameWriter: writes a data stream's frames (net/data_frame.h) on the loop, for both ends: the
// worker's requests, the shard's answers. Frames added until the owner flushes share a write:
// the worker flushes at the end of the loop turn, so a turn's requests go together; the shard
// adds its answers at the end of a turn already and writes them at once. One write runs at a
// time; what is added meanwhile goes in the next, which starts as soon as it is done. Headers
// and bodies under kCopiedBodyBytes are copied into the write's buffer (reused from write to
// write); larger bodies are written from where they lie, with no copy. KJ thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <span>
#include <vector>

#include <kj/async-io.h>

#include "net/data_frame.h"
#include "net/write_batch.h"

namespace psched {

class FrameWriter final : private kj::TaskSet::ErrorHandler {
 public:
  // Bodies at least this large are written from where they lie. Below it a copy is cheaper than
  // a piece of its own (psched-transport-bench --sizes 4KiB).
  static constexpr size_t kCopiedBodyBytes = 64 * 1024;

  // Writes to `stream`, which outlives the writer. `failed` runs once, on the first write that
  // fails; nothing more is written after it.
  FrameWriter(kj::AsyncOutputStream& stream, std::function<void(kj::Exception)> failed);
  ~FrameWriter() noexcept;

  // Adds a frame to the next write; it is written once flushed. A body of kCopiedBodyBytes or
  // more is referenced: the caller keeps it alive and unchanged until it is written (see
  // on_written) or the writer is gone.
  void add(const FrameHeaderBytes& header, std::span<const std::byte> body = {});
  // The same with the body copied whatever its size: the caller's memory is free at once.
  void add_copied(const FrameHeaderBytes& header, std::span<const std::byte> body);
  // The same with the body referenced whatever its size (the worker's gradients, which stay in
  // the trainer's memory until their push is answered anyway).
  void add_referenced(const FrameHeaderBytes& header, std::span<const std::byte> body);
  // The same for a body in several pieces, in order (a table's ids, then their rows).
  void add_referenced(const FrameHeaderBytes& header,
                      std::initializer_list<std::span<const std::byte>> body);
  // Writes what was added at the end of this turn of the loop (or after the write in flight).
  void flush_at_end_of_turn();
  // Writes what was added now (or after the write in flight).
  void flush_now();
  // Bytes added and not yet handed to a write.
  uint64_t waiting_bytes() const { return waiting_bytes_; }
  // Whether a write is in flight.
  bool writing() const { return writing_; }
  // Runs `callback` on the loop each time a write completes (its referenced bodies are free).
  void on_written(std::function<void()> callback) { written_ = std::move(callback); }
  // Resolves when everything added so far is written (at once when nothing waits).
  kj::Promise<void> drained();

 private:
  // A write takes at most this many pieces (below the kernel's IOV_MAX).
  static constexpr size_t kPiecesPerWrite = 256;

  // The batch the next add() goes to.
  WriteBatch& open_batch();
  // Writes the oldest waiting batch, then the next, until none waits (nothing when a write is
  // in flight: it goes on with them).
  kj::Promise<void> write_waiting();
  // Nothing is written or waits: resolves drained().
  void now_idle();
  void taskFailed(kj::Exception&& exception) override;

  kj::AsyncOutputStream& stream_;
  std::function<void(kj::Exception)> failed_;
  std::function<void()> written_;
  // Batches not yet written, oldest first; while writing_, the first is in flight.
  std::deque<WriteBatch> batches_;
  std::vector<WriteBatch> spare_;  // written batches, kept to reuse their memory
  uint64_t waiting_bytes_ = 0;
  bool scheduled_ = false;  // a flush is queued for the end of the turn
  bool writing_ = false;
  bool broken_ = false;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> drained_;  // drained()'s waiters
  kj::TaskSet tasks_;
};

}  // namespace psched
