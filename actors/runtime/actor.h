// SPDX-License-Identifier: Apache-2.0
// The actor runtime: one event loop per thread, the way Seastar runs one shard per core.
//
// An ActorLoop is a thread's KJ event loop as actors see it: the same loop that owns that
// thread's sockets, Cap'n Proto connections and timers. Every actor lives on one loop and runs
// its handlers there one at a time, so actors need no locks. Actors on the same loop call each
// other directly (no hop, no copy); other threads reach an actor through its loop's inbox.
//
// Lifetime: handlers capture `this`. An actor is built and destroyed on its loop's thread;
// work posted to it from other threads must be done (or the loop closed) before it goes.
#pragma once

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <kj/async.h>
#include <kj/function.h>

#include "actors/runtime/inbox.h"

namespace psched {

class ActorLoop final : private kj::TaskSet::ErrorHandler {
 public:
  // Binds to the KJ event loop current on this thread, which must run (wait or poll) for
  // anything posted here to happen.
  ActorLoop();
  ~ActorLoop() noexcept(false);  // on the loop's thread; drops work still queued
  ActorLoop(const ActorLoop&) = delete;
  ActorLoop& operator=(const ActorLoop&) = delete;

  // True on the thread that runs this loop.
  bool here() const { return std::this_thread::get_id() == thread_; }
  // Runs `task` on the loop in a later turn. Any thread; tasks from one thread run in the
  // order posted. A task that throws is a bug: it is logged, and the loop goes on.
  void post(kj::Function<void()> task);
  // From now on, drops what other threads post (the loop is going away). Any thread.
  void close() { inbox_.close(); }

 private:
  void taskFailed(kj::Exception&& exception) override;

  // Runs the posts of the loop's own thread queued so far, in order.
  void run_local();

  std::thread::id thread_;
  Inbox inbox_;  // posts from other threads
  // Posts from the loop's own thread: those of one turn run together in a later turn.
  std::vector<kj::Function<void()>> local_, running_;
  kj::TaskSet later_;  // the turns that run them
  kj::Promise<void> inbox_running_;
};

class Actor {
 public:
  explicit Actor(ActorLoop& loop) : loop_(loop) {}
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // True on the actor's loop thread (inside a handler, or code that may call it directly).
  bool on_loop() const { return loop_.here(); }
  ActorLoop& loop() const { return loop_; }

 protected:
  // Queues `handler` to run on the loop in a later turn (always a hop, even from the loop).
  template <typename Handler>
  void post(Handler&& handler) {
    loop_.post(kj::Function<void()>(std::forward<Handler>(handler)));
  }
  // Runs `handler` at once on the loop thread, else queues it there.
  template <typename Handler>
  void dispatch(Handler&& handler) {
    if (on_loop())
      handler();
    else
      post(std::forward<Handler>(handler));
  }

 private:
  ActorLoop& loop_;
};

// A fulfiller that std::function callbacks can copy (the actors' replies are std::function).
template <typename T>
using SharedFulfiller = std::shared_ptr<kj::Own<kj::PromiseFulfiller<T>>>;

// A promise on this loop and the shared fulfiller an actor's reply resolves it with.
template <typename T>
std::pair<kj::Promise<T>, SharedFulfiller<T>> reply_promise() {
  auto paf = kj::newPromiseAndFulfiller<T>();
  return {kj::mv(paf.promise),
          std::make_shared<kj::Own<kj::PromiseFulfiller<T>>>(kj::mv(paf.fulfiller))};
}

}  // namespace psched
