// SPDX-License-Identifier: Apache-2.0
#include "actors/runtime/actor.h"

#include <exception>

#include "common/kj_error.h"
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
  local_.push_back(kj::mv(task));
  if (local_.size() == 1) later_.add(kj::evalLater([this] { run_local(); }));
}

void ActorLoop::run_local() {
  // What these tasks post goes to local_ again, for a turn of its own.
  std::swap(running_, local_);
  for (auto& task : running_) {
    try {
      task();
    } catch (...) {  // a bug: the loop and the other tasks go on
      log_error("actor task failed: {}",
                to_kj_exception(std::current_exception()).getDescription().cStr());
    }
  }
  running_.clear();  // keeps its memory for the next turn
}

void ActorLoop::taskFailed(kj::Exception&& exception) {
  log_error("actor task failed: {}", exception.getDescription().cStr());
}

}  // namespace psched
