// SPDX-License-Identifier: Apache-2.0
#include "common/fork_join_pool.h"

#include <atomic>
#include <exception>
#include <latch>
#include <memory>
#include <mutex>

#include <pthread.h>

namespace psched {

ForkJoinPool::ForkJoinPool(unsigned helpers) : helpers_(helpers), pool_(helpers ? helpers : 1) {
  // One naming job per thread: each waits for all the others, so no thread takes two. The
  // jobs share the latch: the last one out of arrive_and_wait may leave after this returns.
  auto named = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(helpers));
  for (unsigned h = 0; h < helpers; ++h)
    boost::asio::post(pool_, [named] {
      pthread_setname_np(pthread_self(), "psched-apply");
      named->arrive_and_wait();
    });
  named->wait();
}

ForkJoinPool::~ForkJoinPool() {
  pool_.join();
}

void ForkJoinPool::run(size_t pieces, const std::function<void(size_t)>& piece) {
  // Pieces are claimed from a shared counter, so a slow thread never holds the others up.
  std::atomic<size_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces;) {
      try {
        piece(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  size_t helpers = std::min<size_t>(helpers_, pieces > 0 ? pieces - 1 : 0);
  std::latch done(static_cast<std::ptrdiff_t>(helpers));
  for (size_t h = 0; h < helpers; ++h)
    boost::asio::post(pool_, [&] {
      work();
      done.count_down();
    });
  work();
  done.wait();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace psched
