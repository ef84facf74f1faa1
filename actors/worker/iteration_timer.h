// SPDX-License-Identifier: Apache-2.0
// IterationTimer: a worker's iteration time, measured from its pushes alone. An iteration
// runs from the first push of a step to the first push of a later step (of any variable).
// The Client keeps one for its operator view, the GradientPusher one for its autotuner.
//
// A plain value type with no clock of its own: the caller says when each push came.
#pragma once

#include <chrono>
#include <optional>

#include "common/types.h"

namespace psched {

class IterationTimer {
 public:
  using Clock = std::chrono::steady_clock;

  // A push of `step` came at `now`. Returns the seconds of the iteration it ends: when `step`
  // is beyond every step pushed before and some step was (the first push only starts one).
  std::optional<double> pushed(Step step, Clock::time_point now);

 private:
  Step newest_;                      // the highest step pushed so far (Step(): none yet)
  Clock::time_point newest_pushed_;  // when its first push came
};

}  // namespace psched
