// SPDX-License-Identifier: Apache-2.0
// LoopThread: a thread that runs one KJ event loop, with network and timers, and an ActorLoop
// on it: psched-server runs one per group of shards, a Client one for its worker. Tests run
// their loop on their own thread instead.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include <kj/async-io.h>

#include "actors/runtime/actor.h"
#include "common/check.h"
#include "common/kj_error.h"

namespace psched {

class LoopThread {
 public:
  // Starts the thread, named `name` (as top and perf show it; 15 characters at most);
  // returns once its loop runs.
  explicit LoopThread(const std::string& name);
  // Stops the loop and joins. Whatever was built on the loop must be gone by then (destroy it
  // with call()).
  ~LoopThread();
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  ActorLoop& loop() { return *loop_; }

  // Runs `work(io)` on the loop thread and blocks the caller until it is done; `work` may
  // return a value or a kj::Promise, whose result is returned. Rethrows what it threw
  // (a kj::Exception as the psched::Error it carries). Not from the loop thread itself, nor
  // after stop().
  template <typename Work>
  auto call(Work work) {
    using T = typename ValueOf<std::invoke_result_t<Work&, kj::AsyncIoContext&>>::Type;
    auto result = std::make_shared<std::promise<T>>();
    auto future = result->get_future();
    PSCHED_REQUIRE(loop_ != nullptr);  // not after stop()
    loop_->post([this, result, work = std::move(work)]() mutable {
      try {
        tasks_->add(as_promise<T>(work).then(
            [result](auto... value) { result->set_value(std::move(value)...); },
            [result](kj::Exception&& e) { result->set_exception(to_exception_ptr(e)); }));
      } catch (...) {  // thrown before a promise existed: a psched::Error keeps its code
        result->set_exception(std::current_exception());
      }
    });
    return future.get();
  }

  // Stops the loop (work still queued is dropped) and joins. Idempotent.
  void stop();

 private:
  struct Stopper;
  // What a call resolves with: T for T and for kj::Promise<T>.
  template <typename R>
  struct ValueOf {
    using Type = R;
  };
  template <typename T>
  struct ValueOf<kj::Promise<T>> {
    using Type = T;
  };
  void run(std::promise<void>& started);
  // What `work(io)` returned, as a promise.
  template <typename T, typename Work>
  kj::Promise<T> as_promise(Work& work) {
    if constexpr (std::is_void_v<std::invoke_result_t<Work&, kj::AsyncIoContext&>>) {
      work(*io_);
      return kj::READY_NOW;
    } else {
      return work(*io_);
    }
  }
  // The psched::Error a kj::Exception from the loop carries.
  static std::exception_ptr to_exception_ptr(const kj::Exception& e);

  // Set by the thread before `started`; used there, and for post() from anywhere.
  kj::AsyncIoContext* io_ = nullptr;
  ActorLoop* loop_ = nullptr;
  kj::TaskSet* tasks_ = nullptr;
  std::unique_ptr<Stopper> stopper_;
  std::thread thread_;
};

}  // namespace psched
