// SPDX-License-Identifier: Apache-2.0
#include "common/completion.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("a completion wakes its waiter when another thread sets it") {
  Completion done;
  CHECK_FALSE(done.ready());
  int result = 0;  // written before set(), read after wait()
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    result = 42;
    done.set();
  });
  done.wait();
  CHECK(result == 42);
  CHECK(done.ready());
  done.wait();  // returns at once once set
  worker.join();
}

TEST_CASE("a completion set with an error rethrows it to the waiter") {
  Completion done;
  std::thread worker([&] { done.set(std::make_exception_ptr(std::runtime_error("shard lost"))); });
  CHECK_THROWS_WITH_AS(done.wait(), "shard lost", std::runtime_error);
  worker.join();
  CHECK(done.ready());
}

TEST_CASE("a spinning waiter sees a completion set while it spins, and one set after it sleeps") {
  using std::chrono::microseconds;
  Completion soon, late;
  std::thread worker([&] {
    soon.set();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    late.set();
  });
  soon.wait(microseconds(1'000'000));  // set within the spin
  late.wait(microseconds(1));          // spins 1 µs, then (almost surely) sleeps until set
  CHECK(soon.ready());
  CHECK(late.ready());
  worker.join();
}

TEST_CASE("a wait spins only after a wait that took at most twice the spin") {
  using std::chrono::microseconds;
  WaitSpin spin(microseconds(50));
  CHECK(spin.next() == microseconds(50));  // nothing known yet: try it
  spin.waited(microseconds(101));
  CHECK(spin.next() == microseconds(0));
  spin.waited(microseconds(100));
  CHECK(spin.next() == microseconds(50));
  spin.waited(std::chrono::milliseconds(3));  // a large partition's wait
  CHECK(spin.next() == microseconds(0));
}

TEST_CASE("a completion's wait tells its WaitSpin how long it took, error or not") {
  // A spin of 10 s makes every wait here short, however loaded the machine.
  const std::chrono::microseconds ten_seconds = std::chrono::seconds(10);
  WaitSpin spin(ten_seconds);
  spin.waited(std::chrono::seconds(60));
  CHECK(spin.next() == std::chrono::microseconds(0));
  Completion ready_at_once;
  ready_at_once.set();
  ready_at_once.wait(spin);  // set already: returns at once, without spinning
  CHECK(spin.next() == ten_seconds);
  spin.waited(std::chrono::seconds(60));
  Completion failed;
  failed.set(std::make_exception_ptr(std::runtime_error("shard lost")));
  CHECK_THROWS_WITH_AS(failed.wait(spin), "shard lost", std::runtime_error);
  CHECK(spin.next() == ten_seconds);
}
