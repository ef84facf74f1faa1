// SPDX-License-Identifier: Apache-2.0
#include "actors/runtime/inbox.h"

#include <thread>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("tasks posted from another thread run on the loop thread in posting order") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  Inbox mailbox;
  std::vector<int> ran;
  auto loop_thread = std::this_thread::get_id();
  bool all_on_loop_thread = true;
  std::thread poster([&] {
    for (int i = 0; i < 100; ++i)
      mailbox.post([&, i] {
        all_on_loop_thread &= std::this_thread::get_id() == loop_thread;
        ran.push_back(i);
      });
    mailbox.close();
  });
  mailbox.run().wait(scope);
  poster.join();
  REQUIRE(ran.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(ran[i] == i);
  CHECK(all_on_loop_thread);
}

TEST_CASE("a task posted from the loop thread itself runs on the next turn") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  Inbox mailbox;
  auto running = mailbox.run().eagerlyEvaluate(nullptr);
  int ran = 0;
  mailbox.post([&] { ++ran; });
  CHECK(ran == 0);
  scope.poll();
  CHECK(ran == 1);
  mailbox.post([&] { ++ran; });
  scope.poll();
  CHECK(ran == 2);
}

TEST_CASE("a closed inbox drops what is posted afterwards") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  Inbox mailbox;
  int ran = 0;
  mailbox.post([&] { ++ran; });
  mailbox.close();
  mailbox.post([&] { ++ran; });
  mailbox.run().wait(scope);
  CHECK(ran == 1);
}
