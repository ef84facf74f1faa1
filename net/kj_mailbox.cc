#include "net/kj_mailbox.h"

#include "common/log.h"

namespace psched {

KjMailbox::KjMailbox() = default;

void KjMailbox::post(std::function<void()> task) {
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(task));
  if (wake_) {
    wake_->fulfill();
    wake_ = nullptr;
  }
}

void KjMailbox::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  if (wake_) {
    wake_->fulfill();
    wake_ = nullptr;
  }
}

kj::Promise<void> KjMailbox::wait_for_mail() {
  std::lock_guard lock(mutex_);
  if (!queue_.empty() || closed_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  wake_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<void> KjMailbox::run() {
  return wait_for_mail().then([this]() -> kj::Promise<void> {
    std::vector<std::function<void()>> tasks;
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
        // which must not take the KJ thread (and every call in flight) down with it.
        log_error("KJ mailbox task failed: {}", e.what());
      }
    }
    if (closed) return kj::READY_NOW;
    return run();
  });
}

}  // namespace psched
