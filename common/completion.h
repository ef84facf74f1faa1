// SPDX-License-Identifier: Apache-2.0
// Completion: the end of one piece of work, handed from the thread that finishes it to the
// one thread that waits for it: set once, with an error or without. A waiter sleeps on the
// flag itself (std::atomic::wait, a futex on Linux), and set() wakes it with one system call
// at most; std::promise takes a lock, a once-flag and two futex calls for the same.
//
// A waiter may first spin for a short while: when the work ends within it, the waiter goes on
// at once instead of paying a sleep and a wake (10-20 µs each on a small virtual machine),
// which is most of a small request's round trip.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>

namespace psched {

class Completion {
 public:
  // Marks the work done, failed with `error` when it is not null. Once; any thread.
  void set(std::exception_ptr error = nullptr) {
    error_ = std::move(error);
    done_.store(1, std::memory_order_release);
    done_.notify_one();
  }
  // Whether set() has happened.
  bool ready() const { return done_.load(std::memory_order_acquire) != 0; }
  // Blocks until set(), spinning for up to `spin` before it sleeps; rethrows its error. One
  // waiting thread.
  void wait(std::chrono::microseconds spin = {}) const {
    auto until = std::chrono::steady_clock::now() + spin;
    while (!ready() && std::chrono::steady_clock::now() < until) relax();
    done_.wait(0, std::memory_order_acquire);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Tells the core this is a spin loop (frees the pipeline for its sibling hyperthread).
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::exception_ptr error_;  // written before done_, read after
  std::atomic<uint32_t> done_{0};
};

}  // namespace psched
