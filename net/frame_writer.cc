// SPDX-License-Identifier: Apache-2.0
#include "net/frame_writer.h"

namespace psched {

FrameWriter::FrameWriter(kj::AsyncOutputStream& stream, std::function<void(kj::Exception)> failed)
    : stream_(stream), failed_(std::move(failed)), tasks_(*this) {}

FrameWriter::~FrameWriter() noexcept = default;

WriteBatch& FrameWriter::open_batch() {
  bool in_flight_only = writing_ && batches_.size() == 1;  // the in-flight batch is sealed
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
  add_referenced(header, body);
}

void FrameWriter::add_referenced(const FrameHeaderBytes& header, std::span<const std::byte> body) {
  add_referenced(header, {body});
}

void FrameWriter::add_referenced(const FrameHeaderBytes& header,
                                 std::initializer_list<std::span<const std::byte>> body) {
  if (broken_) return;
  WriteBatch& batch = open_batch();
  batch.copy(header);
  waiting_bytes_ += header.size();
  for (std::span<const std::byte> piece : body) {
    if (!piece.empty()) batch.reference(piece);
    waiting_bytes_ += piece.size();
  }
}

void FrameWriter::add_copied(const FrameHeaderBytes& header, std::span<const std::byte> body) {
  if (broken_) return;
  WriteBatch& batch = open_batch();
  batch.copy(header);
  batch.copy(body);
  waiting_bytes_ += header.size() + body.size();
}

void FrameWriter::flush_at_end_of_turn() {
  if (writing_ || scheduled_) return;
  scheduled_ = true;
  tasks_.add(kj::evalLast([this] {
    scheduled_ = false;
    return write_waiting();
  }));
}

void FrameWriter::flush_now() {
  if (!writing_) tasks_.add(write_waiting());
}

kj::Promise<void> FrameWriter::write_waiting() {
  if (writing_) return kj::READY_NOW;  // it goes on with what waits
  if (batches_.empty() || broken_) {
    now_idle();
    return kj::READY_NOW;
  }
  writing_ = true;
  WriteBatch& batch = batches_.front();  // a deque: later batches never move it
  waiting_bytes_ -= batch.bytes();
  return stream_.write(batch.gather()).then([this] {
    batches_.front().clear();
    spare_.push_back(std::move(batches_.front()));
    batches_.pop_front();
    writing_ = false;
    if (written_) written_();  // may add and flush: that goes in the next write
    return write_waiting();
  });
}

void FrameWriter::now_idle() {
  for (auto& waiter : drained_) waiter->fulfill();
  drained_.clear();
}

kj::Promise<void> FrameWriter::drained() {
  if (!writing_ && batches_.empty()) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  drained_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void FrameWriter::taskFailed(kj::Exception&& exception) {
  broken_ = true;
  writing_ = false;
  if (failed_) failed_(kj::mv(exception));
}

}  // namespace psched
