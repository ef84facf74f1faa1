// SPDX-License-Identifier: Apache-2.0
// WriteBatch: the bytes of one gathered write, in the order added: small pieces copied into one
// buffer, large ones referenced where they lie (whoever adds them keeps them alive until the
// write is done). Both batching layers use it: FrameWriter (the data stream's frames,
// net/frame_writer.h) and the write coalescing under Cap'n Proto connections
// (net/write_coalescing.h). clear() keeps the buffer's memory for the next write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <kj/common.h>

namespace psched {

class WriteBatch {
 public:
  uint64_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  // Pieces a write of it takes (a run of copied bytes is one).
  size_t pieces() const { return pieces_.size() + (buffer_.size() > cut_at_ ? 1 : 0); }

  void copy(std::span<const std::byte> bytes);
  void reference(std::span<const std::byte> bytes);
  // The pieces to write, in order; valid until the batch changes.
  kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> gather();
  void clear();

 private:
  struct Piece {
    const std::byte* referenced;  // null: bytes at `offset` in buffer_
    size_t offset;
    size_t size;
  };
  // Ends the copied run being built, if any.
  void cut();

  std::vector<std::byte> buffer_;
  size_t cut_at_ = 0;
  uint64_t bytes_ = 0;
  std::vector<Piece> pieces_;
  std::vector<kj::ArrayPtr<const kj::byte>> gathered_;
};

}  // namespace psched
