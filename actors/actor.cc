#include "actors/actor.h"

namespace psched {

ActorRuntime::ActorRuntime(unsigned threads) : work_(io_.get_executor()) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { io_.run(); });
}

ActorRuntime::~ActorRuntime() {
  stop();
}

void ActorRuntime::stop() {
  work_.reset();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

}  // namespace psched
