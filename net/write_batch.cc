// SPDX-License-Identifier: Apache-2.0
#include "net/write_batch.h"

namespace psched {

void WriteBatch::copy(std::span<const std::byte> bytes) {
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  bytes_ += bytes.size();
}

void WriteBatch::reference(std::span<const std::byte> bytes) {
  cut();
  pieces_.push_back({bytes.data(), 0, bytes.size()});
  bytes_ += bytes.size();
}

void WriteBatch::cut() {
  if (buffer_.size() > cut_at_) pieces_.push_back({nullptr, cut_at_, buffer_.size() - cut_at_});
  cut_at_ = buffer_.size();
}

kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> WriteBatch::gather() {
  cut();
  gathered_.clear();
  for (const Piece& p : pieces_) {
    const std::byte* at = p.referenced ? p.referenced : buffer_.data() + p.offset;
    gathered_.emplace_back(reinterpret_cast<const kj::byte*>(at), p.size);
  }
  return {gathered_.data(), gathered_.size()};
}

void WriteBatch::clear() {
  buffer_.clear();
  pieces_.clear();
  cut_at_ = bytes_ = 0;
}

}  // namespace psched
