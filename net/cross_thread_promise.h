// A KJ promise that another thread (an actor's strand) fulfils. The fulfiller sits behind a
// shared_ptr so std::function callbacks can copy it; it may be fulfilled or rejected from any
// thread, and the promise resolves on the KJ thread that made it.
#pragma once

#include <memory>
#include <utility>

#include <kj/async.h>

namespace psched {

template <typename T>
using SharedFulfiller = std::shared_ptr<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>;

template <typename T>
std::pair<kj::Promise<T>, SharedFulfiller<T>> cross_thread_promise() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
  return {kj::mv(paf.promise),
          std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>(kj::mv(paf.fulfiller))};
}

}  // namespace psched
