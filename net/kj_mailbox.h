// KjMailbox: runs functions on the thread that owns a KJ event loop, posted from any thread
// (Asio strands, the trainer). Capability clients and call contexts are not thread-safe, so
// every RPC is started from here. Created on the KJ thread; run() must be driven by that loop.
#pragma once

#include <functional>
#include <mutex>
#include <vector>

#include <kj/async.h>

namespace psched {

class KjMailbox {
 public:
  KjMailbox();

  // Queues `task` to run on the KJ thread (in posting order). Any thread.
  void post(std::function<void()> task);
  // Drains the mailbox forever; keep the promise alive on the KJ thread (a TaskSet or
  // `.eagerlyEvaluate()`), cancel it by dropping it. Tasks still queued are dropped then.
  kj::Promise<void> run();
  // Wakes run() for a last drain and makes it return. Any thread.
  void close();

 private:
  kj::Promise<void> wait_for_mail();

  std::mutex mutex_;
  std::vector<std::function<void()>> queue_;             // guarded by mutex_
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> wake_;  // guarded by mutex_
  bool closed_ = false;                                  // guarded by mutex_
};

}  // namespace psched
