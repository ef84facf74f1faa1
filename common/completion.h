// SPDX-License-Identifier: Apache-2.0
// Completion: the end of one piece of work, handed from the thread that finishes it to the
// one thread that waits for it: set once, with an error or without. A waiter sleeps on the
// flag itself (std::atomic::wait, a futex on Linux), and set() wakes it with one system call
// at most; std::promise takes a lock, a once-flag and two futex calls for the same.
//
// A waiter may first spin for a short while: when the work ends within it, the waiter goes on
// at once instead of paying a sleep and a wake (10-20 µs each on a small virtual machine),
// which is most of a small request's round trip. WaitSpin decides, from the waiter's last wait,
// whether that is worth trying.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>

namespace psched {

// How long one thread's waits spin: `spin` after a wait that took at most twice that (sleep and
// wake included), else not at all, since waits that long would burn the spin for nothing.
class WaitSpin {
 public:
  explicit WaitSpin(std::chrono::microseconds spin) : spin_(spin) {}
  // The spin for the next wait.
  std::chrono::microseconds next() const {
    return last_was_short_.load(std::memory_order_relaxed) ? spin_ : std::chrono::microseconds{};
  }
  // Records that a wait took `took`.
  void waited(std::chrono::nanoseconds took) {
    last_was_short_.store(took <= 2 * spin_, std::memory_order_relaxed);
  }

 private:
  const std::chrono::microseconds spin_;
  std::atomic<bool> last_was_short_{true};
};

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
  // Blocks until set(), spinning as `spin` says and telling it how long the wait took.
  void wait(WaitSpin& spin) const {
    auto start = std::chrono::steady_clock::now();
    try {
      wait(spin.next());
    } catch (...) {
      spin.waited(std::chrono::steady_clock::now() - start);
      throw;
    }
    spin.waited(std::chrono::steady_clock::now() - start);
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
