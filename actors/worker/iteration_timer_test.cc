// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/iteration_timer.h"

#include <doctest/doctest.h>

using namespace psched;

namespace {

IterationTimer::Clock::time_point at(int seconds) {
  return IterationTimer::Clock::time_point(std::chrono::seconds(seconds));
}

}  // namespace

TEST_CASE("an iteration runs from the first push of a step to the first push of a later one") {
  IterationTimer timer;
  CHECK(timer.pushed(Step(1), at(10)) == std::nullopt);  // starts the first iteration
  CHECK(timer.pushed(Step(1), at(11)) == std::nullopt);  // another variable's push of step 1
  CHECK(timer.pushed(Step(2), at(13)) == 3.0);
  CHECK(timer.pushed(Step(1), at(14)) == std::nullopt);  // a late push of an older step
  CHECK(timer.pushed(Step(2), at(15)) == std::nullopt);
  CHECK(timer.pushed(Step(4), at(20)) == 7.0);  // a skipped step ends the iteration all the same
}
