// SPDX-License-Identifier: Apache-2.0
// CuttingStream: a byte stream that breaks on cue, as a network failure mid-message would.
// Wraps another stream; once the plan's byte budget is written it writes no more, shuts the
// inner stream's write side (the peer reads a truncated message, then end of stream) and fails
// every later write with a lost connection. Reads pass through until the peer hangs up.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include <kj/async-io.h>

namespace psched::testing {

// Shared by the test and the stream it plans to cut; one cut, then the budget is unlimited.
struct CutPlan {
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  uint64_t bytes_left = kNever;  // written before the cut
  uint64_t cuts = 0;             // cuts made
  uint64_t open = 0;             // streams made with this plan and not yet destroyed
  // While set, reads wait for it (as a peer that stopped reading: the other side's writes
  // back up); reset it after fulfilling what it was forked from.
  kj::Maybe<kj::ForkedPromise<void>> reads_held;
};

class CuttingStream final : public kj::AsyncIoStream {
 public:
  CuttingStream(kj::Own<kj::AsyncIoStream> inner, std::shared_ptr<CutPlan> plan)
      : inner_(kj::mv(inner)), plan_(std::move(plan)) {
    ++plan_->open;
  }
  ~CuttingStream() noexcept(false) { --plan_->open; }

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    KJ_IF_MAYBE (held, plan_->reads_held) {
      return held->addBranch().then([this, buffer, min_bytes, max_bytes] {
        return inner_->tryRead(buffer, min_bytes, max_bytes);
      });
    }
    return inner_->tryRead(buffer, min_bytes, max_bytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override;
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override;
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  std::shared_ptr<CutPlan> plan_;
  bool cut_ = false;
};

}  // namespace psched::testing
