// SPDX-License-Identifier: Apache-2.0
#include "net/frame_writer.h"

namespace psched {

void FrameWriter::Batch::copy(std::span<const std::byte> bytes) {
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  bytes_ += bytes.size();
}

void FrameWriter::Batch::reference(std::span<const std::byte> bytes) {
  cut();
  pieces_.push_back({bytes.data(), 0, bytes.size()});
  bytes_ += bytes.size();
}

void FrameWriter::Batch::cut() {
  if (buffer_.size() > cut_at_) pieces_.push_back({nullptr, cut_at_, buffer_.size() - cut_at_});
  cut_at_ = buffer_.size();
}

kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> FrameWriter::Batch::gather() {
  cut();
  gathered_.clear();
  for (const Piece& p : pieces_) {
    const std::byte* at = p.referenced ? p.referenced : buffer_.data() + p.offset;
    gathered_.emplace_back(reinterpret_cast<const kj::byte*>(at), p.size);
  }
  return {gathered_.data(), gathered_.size()};
}

void FrameWriter::Batch::clear() {
  buffer_.clear();
  pieces_.clear();
  cut_at_ = bytes_ = 0;
}

FrameWriter::FrameWriter(kj::AsyncOutputStream& stream, std::function<void(kj::Exception)> failed)
    : stream_(stream), failed_(std::move(failed)), tasks_(*this) {}

FrameWriter::~FrameWriter() noexcept = default;

FrameWriter::Batch& FrameWriter::open_batch() {
  bool in_flight_only = writing_ && batches_.size() == 1;
  if (batches_.empty() || in_flight_only || batches_.back().pieces() >= kPiecesPerWrite) {
    if (spare_.empty()) {
      batches_.emplace_back();
    } else {
      batches_.push_back(std::move(spare_.back()));
      spare_.pop_back();
    }
  }
  return batches_.back();
}

void FrameWriter::add(const FrameHeaderBytes& header, std::span<const std::byte> body) {
  if (body.size() < kCopiedBodyBytes) return add_copied(header, body);
  if (broken_) return;
  Batch& batch = open_batch();
  batch.copy(header);
  batch.reference(body);
  added(header.size() + body.size());
}

void FrameWriter::add_copied(const FrameHeaderBytes& header, std::span<const std::byte> body) {
  if (broken_) return;
  Batch& batch = open_batch();
  batch.copy(header);
  batch.copy(body);
  added(header.size() + body.size());
}

void FrameWriter::added(uint64_t bytes) {
  waiting_bytes_ += bytes;
  if (writing_ || scheduled_) return;
  scheduled_ = true;
  // At the end of the turn, so that the frames of one turn share a write.
  tasks_.add(kj::evalLast([this] {
    scheduled_ = false;
    return write_waiting();
  }));
}

kj::Promise<void> FrameWriter::write_waiting() {
  if (batches_.empty() || broken_) return kj::READY_NOW;
  writing_ = true;
  Batch& batch = batches_.front();  // a deque: later batches never move it
  waiting_bytes_ -= batch.bytes();
  return stream_.write(batch.gather()).then([this] {
    batches_.front().clear();
    spare_.push_back(std::move(batches_.front()));
    batches_.pop_front();
    writing_ = !batches_.empty();
    if (written_) written_();  // may add(), which then starts a write of its own if none runs
    if (writing_) return write_waiting();
    if (!scheduled_ && drained_.get() != nullptr) {
      drained_->fulfill();
      drained_ = nullptr;
    }
    return kj::Promise<void>(kj::READY_NOW);
  });
}

kj::Promise<void> FrameWriter::drained() {
  if (!writing_ && !scheduled_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  drained_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void FrameWriter::taskFailed(kj::Exception&& exception) {
  broken_ = true;
  writing_ = false;
  if (failed_) failed_(kj::mv(exception));
}

}  // namespace psched
