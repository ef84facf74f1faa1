// SPDX-License-Identifier: Apache-2.0
// ForkJoinPool: runs the pieces of one job on a few threads and returns when all are done.
// The shard uses it to apply a large partition on several cores from inside one handler (the
// handler blocks; the shard's loop is busy with that partition anyway). Idle threads sleep on
// the Asio pool's condition variable: no spinning between jobs. Shards on several threads may
// share one pool: each run() is independent.
#pragma once

#include <cstddef>
#include <functional>

#include "common/asio.h"

namespace psched {

class ForkJoinPool {
 public:
  // `helpers` threads besides the caller, which always runs a share too; they are named
  // "psched-apply" (as top and perf show them).
  explicit ForkJoinPool(unsigned helpers);
  ~ForkJoinPool();  // joins

  // Calls piece(i) for every i in [0, pieces), on the helpers and the calling thread, and
  // returns when all calls returned. Rethrows the first exception a piece threw.
  void run(size_t pieces, const std::function<void(size_t)>& piece);
  // Threads a job can use at once (helpers + the caller).
  unsigned width() const { return helpers_ + 1; }

 private:
  unsigned helpers_;
  boost::asio::thread_pool pool_;
};

}  // namespace psched
