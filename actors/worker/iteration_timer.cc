// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/iteration_timer.h"

namespace psched {

std::optional<double> IterationTimer::pushed(Step step, Clock::time_point now) {
  if (step <= newest_) return std::nullopt;
  std::optional<double> seconds;
  if (newest_ != Step()) seconds = std::chrono::duration<double>(now - newest_pushed_).count();
  newest_ = step;
  newest_pushed_ = now;
  return seconds;
}

}  // namespace psched
