// SPDX-License-Identifier: Apache-2.0
#include "actors/runtime/inbox.h"

#include "common/log.h"

namespace psched {

Inbox::Inbox() = default;

void Inbox::post(kj::Function<void()> task) {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  queue_.push_back(kj::mv(task));
  if (wake_) {
    wake_->fulfill();
    wake_ = nullptr;
  }
}

void Inbox::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  if (wake_) {
    wake_->fulfill();
    wake_ = nullptr;
  }
}

kj::Promise<void> Inbox::wait_for_mail() {
  std::lock_guard lock(mutex_);
  if (!queue_.empty() || closed_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  wake_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<void> Inbox::run() {
  return wait_for_mail().then([this]() -> kj::Promise<void> {
    std::vector<kj::Function<void()>> tasks;
    bool closed;
    {
      std::lock_guard lock(mutex_);
      tasks.swap(queue_);
      closed = closed_;
    }
    for (auto& task : tasks) {
      try {
        task();
      } catch (const std::exception& e) {
        // A task reports its own failures through its callbacks; one that throws is a bug,
        // which must not take the loop (and every call in flight) down with it.
        log_error("inbox task failed: {}", e.what());
      }
    }
    if (closed) return kj::READY_NOW;
    return run();
  });
}

}  // namespace psched
