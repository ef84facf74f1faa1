// SPDX-License-Identifier: Apache-2.0
#include "actors/actor.h"

#include "common/log.h"

namespace psched {

ActorLoop::ActorLoop()
    : thread_(std::this_thread::get_id()),
      later_(*this),
      inbox_running_(inbox_.run().eagerlyEvaluate([](kj::Exception&& e) {
        log_error("actor loop inbox: {}", e.getDescription().cStr());
      })) {}

ActorLoop::~ActorLoop() noexcept(false) {
  inbox_.close();
}

void ActorLoop::post(kj::Function<void()> task) {
  if (!here()) return inbox_.post(kj::mv(task));
  later_.add(kj::evalLater([task = kj::mv(task)]() mutable { task(); }));
}

void ActorLoop::taskFailed(kj::Exception&& exception) {
  log_error("actor task failed: {}", exception.getDescription().cStr());
}

}  // namespace psched
