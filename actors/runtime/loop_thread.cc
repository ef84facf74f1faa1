// SPDX-License-Identifier: Apache-2.0
#include "actors/runtime/loop_thread.h"

#include <pthread.h>

#include "common/log.h"

namespace psched {

// Ends the thread's wait; fulfilled on the loop thread.
struct LoopThread::Stopper final : kj::TaskSet::ErrorHandler {
  kj::Own<kj::PromiseFulfiller<void>> fulfiller;
  void taskFailed(kj::Exception&& e) override {
    log_error("loop thread task failed: {}", e.getDescription().cStr());
  }
};

LoopThread::LoopThread(const std::string& name) : stopper_(std::make_unique<Stopper>()) {
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started, name] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    run(started);
  });
  ready.get();
}

LoopThread::~LoopThread() {
  stop();
}

void LoopThread::run(std::promise<void>& started) {
  auto io = kj::setupAsyncIo();
  ActorLoop loop;
  kj::TaskSet tasks(*stopper_);
  auto stop = kj::newPromiseAndFulfiller<void>();
  stopper_->fulfiller = kj::mv(stop.fulfiller);
  io_ = &io;
  loop_ = &loop;
  tasks_ = &tasks;
  started.set_value();
  stop.promise.wait(io.waitScope);
  loop.close();
}

void LoopThread::stop() {
  if (!thread_.joinable()) return;
  loop_->post([this] { stopper_->fulfiller->fulfill(); });
  thread_.join();
  loop_ = nullptr;
}

std::exception_ptr LoopThread::to_exception_ptr(const kj::Exception& e) {
  return std::make_exception_ptr(from_kj_exception(e));
}

}  // namespace psched
