// SPDX-License-Identifier: Apache-2.0
#include "net/write_coalescing.h"

#include <utility>

#include <capnp/message.h>
#include <capnp/rpc.capnp.h>

#include "net/write_batch.h"

namespace psched {
namespace {

// Cap'n Proto writes a one-segment message as two pieces, its segment table and its segment;
// a Finish fits in a few words. Anything else (not a message, a malformed one) is not one.
bool is_finish(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  constexpr size_t kMaxFinishBytes = 8 * sizeof(capnp::word);
  if (pieces.size() != 2 || pieces[0].size() != sizeof(capnp::word) ||
      pieces[1].size() > kMaxFinishBytes || pieces[1].size() % sizeof(capnp::word) != 0 ||
      reinterpret_cast<uintptr_t>(pieces[1].begin()) % alignof(capnp::word) != 0)
    return false;
  kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(pieces[1].begin()),
                                        pieces[1].size() / sizeof(capnp::word));
  capnp::SegmentArrayMessageReader message(kj::arrayPtr(&words, 1));
  bool finish = false;
  auto failure = kj::runCatchingExceptions(
      [&] { finish = message.getRoot<capnp::rpc::Message>().isFinish(); });
  return failure == nullptr && finish;
}

class CoalescingStream final : public WriteCoalescingStream, private kj::TaskSet::ErrorHandler {
 public:
  CoalescingStream(kj::Own<kj::AsyncIoStream> inner, size_t small_bytes, kj::Timer* finish_timer)
      : WriteCoalescingStream(kj::mv(inner)),
        small_bytes_(small_bytes),
        finish_timer_(finish_timer),
        flushes_(*this) {}

  kj::Promise<void> drained() override {
    if (!pending_.empty()) return hand_on({});
    auto all_written = kj::mv(tail_).fork();
    tail_ = all_written.addBranch();
    return all_written.addBranch();
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    kj::ArrayPtr<const kj::byte> piece(static_cast<const kj::byte*>(buffer), size);
    return write(kj::arrayPtr(&piece, 1));
  }

  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    KJ_IF_MAYBE (failure, failure_) return kj::cp(*failure);
    size_t size = 0;
    for (auto piece : pieces) size += piece.size();
    if (size > small_bytes_) return hand_on(pieces);
    bool hold = finish_timer_ != nullptr && (pending_.empty() || holding_) && is_finish(pieces);
    for (auto piece : pieces)
      pending_.copy({reinterpret_cast<const std::byte*>(piece.begin()), piece.size()});
    holding_ = hold;
    if (hold) {
      hold_for_next_write();
    } else if (pending_.bytes() >= kFlushBytes) {
      flushes_.add(hand_on({}));
    } else if (!flush_scheduled_) {
      flush_scheduled_ = true;
      flushes_.add(kj::evalLast([this]() -> kj::Promise<void> {
        flush_scheduled_ = false;
        if (pending_.empty()) return kj::READY_NOW;  // went ahead of a large message
        return hand_on({});
      }));
    }
    return kj::READY_NOW;
  }

  // Writes what is buffered first, at once when no write is in progress: an abort sent just
  // before the connection closes still leaves.
  void shutdownWrite() override {
    if (pending_.empty() && writes_in_progress_ == 0) return inner().shutdownWrite();
    flushes_.add(drained().then([this] { inner().shutdownWrite(); }));
  }

 private:
  // What is buffered (Finish messages alone) leaves with the next write, or kFinishHold from
  // now: one timer at a time, which hands on whatever is buffered then.
  void hold_for_next_write() {
    if (hold_timer_armed_) return;
    hold_timer_armed_ = true;
    flushes_.add(finish_timer_->afterDelay(kFinishHold).then([this]() -> kj::Promise<void> {
      hold_timer_armed_ = false;
      if (pending_.empty() || flush_scheduled_) return kj::READY_NOW;
      return hand_on({});
    }));
  }

  // Buffered bytes beyond this are handed on at once rather than at the end of the turn.
  static constexpr size_t kFlushBytes = 64 * 1024;

  // Writes the buffered small messages and then `pieces` (caller-owned until the promise
  // resolves) in one writev once every earlier write is done: at once when none is in progress.
  kj::Promise<void> hand_on(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
    auto batch = kj::heap<WriteBatch>(std::move(pending_));
    pending_ = WriteBatch();
    holding_ = false;
    for (auto piece : pieces)
      batch->reference({reinterpret_cast<const std::byte*>(piece.begin()), piece.size()});
    auto start = [this, &written = *batch] { return inner().write(written.gather()); };
    kj::Promise<void> writing =
        writes_in_progress_++ == 0 ? kj::evalNow(start) : tail_.then(kj::mv(start));
    auto written = writing
                       .then([this] { --writes_in_progress_; },
                             [this](kj::Exception&& e) {
                               --writes_in_progress_;
                               kj::throwFatalException(kj::mv(e));
                             })
                       .attach(kj::mv(batch))
                       .fork();
    tail_ = written.addBranch();
    return written.addBranch();
  }

  void taskFailed(kj::Exception&& exception) override {
    if (failure_ == nullptr) failure_ = kj::mv(exception);
  }

  size_t small_bytes_;
  kj::Timer* finish_timer_;                 // null: Finish messages are not held
  WriteBatch pending_;                      // small messages accepted and not yet handed on
  bool flush_scheduled_ = false;            // an end-of-turn flush is queued
  bool holding_ = false;                    // pending_ holds only Finish messages
  bool hold_timer_armed_ = false;           // hold_for_next_write's timer runs
  kj::Promise<void> tail_ = kj::READY_NOW;  // resolves when every write handed on is done
  unsigned writes_in_progress_ = 0;         // handed on and not yet done
  kj::Maybe<kj::Exception> failure_;        // the first failed flush: later writes fail with it
  kj::TaskSet flushes_;
};

}  // namespace

kj::Own<WriteCoalescingStream> with_write_coalescing(kj::Own<kj::AsyncIoStream> stream,
                                                     size_t small_bytes, kj::Timer* finish_timer) {
  return kj::heap<CoalescingStream>(kj::mv(stream), small_bytes, finish_timer);
}

}  // namespace psched
