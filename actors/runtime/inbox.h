// SPDX-License-Identifier: Apache-2.0
// Inbox: work posted to a KJ event loop from any thread. The loop's thread drains it; other
// threads (a trainer, the HTTP thread, a checkpoint writer) post. A lock guards only the queue
// hand-over, never actor state.
#pragma once

#include <mutex>
#include <vector>

#include <kj/async.h>
#include <kj/function.h>

namespace psched {

class Inbox {
 public:
  Inbox();

  // Queues `task` to run on the loop's thread (in posting order). Any thread. Tasks may be
  // move-only.
  void post(kj::Function<void()> task);
  // Drains the inbox until close(); keep the promise alive on the loop's thread (a TaskSet or
  // `.eagerlyEvaluate()`), cancel it by dropping it. Tasks still queued are dropped then.
  kj::Promise<void> run();
  // Wakes run() for a last drain and makes it return; later posts are dropped. Any thread.
  void close();

 private:
  kj::Promise<void> wait_for_mail();

  std::mutex mutex_;
  std::vector<kj::Function<void()>> queue_;              // guarded by mutex_
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> wake_;  // guarded by mutex_
  bool closed_ = false;                                  // guarded by mutex_
};

}  // namespace psched
