// SPDX-License-Identifier: Apache-2.0
#include "actors/runtime/actor.h"

#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

TEST_CASE(
    "posts from the loop's own thread run in a later turn, in order; theirs in a turn after") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  ActorLoop actors;
  std::vector<int> ran;
  for (int i = 0; i < 3; ++i)
    actors.post([&, i] {
      ran.push_back(i);
      if (i == 0) actors.post([&] { ran.push_back(10); });
    });
  CHECK(ran.empty());
  // What runs between: another event queued after the posts.
  auto between = kj::evalLater([&] { ran.push_back(5); }).eagerlyEvaluate(nullptr);
  scope.poll();
  CHECK(ran == std::vector<int>{0, 1, 2, 5, 10});
}

TEST_CASE("a posted task that throws is logged, and the tasks after it run") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  ActorLoop actors;
  std::vector<int> ran;
  actors.post([&] { ran.push_back(1); });
  actors.post([] { throw std::logic_error("a bug in a handler"); });
  actors.post([&] { ran.push_back(3); });
  scope.poll();
  actors.post([&] { ran.push_back(4); });
  scope.poll();
  CHECK(ran == std::vector<int>{1, 3, 4});
}
