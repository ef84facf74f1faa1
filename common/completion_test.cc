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
  late.wait(microseconds(1));          // spins 1 µs, then sleeps until set
  CHECK(soon.ready());
  CHECK(late.ready());
  worker.join();
}
