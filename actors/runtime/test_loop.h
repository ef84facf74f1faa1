// SPDX-License-Identifier: Apache-2.0
// TestLoop: the actor runtime on a test's own thread (a KJ event loop and an ActorLoop on it),
// for deterministic tests: handlers the test calls run at once; what they post runs when the
// test drains the loop.
#pragma once

#include <kj/async.h>

#include "actors/runtime/actor.h"

namespace psched::testing {

struct TestLoop {
  kj::EventLoop events;
  kj::WaitScope scope{events};
  ActorLoop actors;

  // Runs everything queued, and everything that queues, until nothing is left.
  void drain() { scope.poll(); }
  // Runs the loop until `promise` resolves (blocking for work posted from other threads);
  // returns its value.
  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(scope);
  }
};

}  // namespace psched::testing
