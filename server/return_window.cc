// SPDX-License-Identifier: Apache-2.0
#include "server/return_window.h"

#include <algorithm>

#include "server/data_plane.h"

namespace psched {

void ReturnWindow::serve(RpcConnection& connection) {
  connection_ = &connection;
  // Cap'n Proto counts the write done in a later continuation.
  connection.on_written([this] { at_end_of_turn(); });
}

bool ReturnWindow::has_room() const {
  return connection_ != nullptr && connection_->queued_bytes() + sent_this_turn_ < window_;
}

void ReturnWindow::sent(uint64_t bytes) {
  sent_this_turn_ += bytes;
  at_end_of_turn();
}

void ReturnWindow::watch(std::weak_ptr<DataPlane> plane) {
  std::erase_if(planes_, [](const std::weak_ptr<DataPlane>& p) { return p.expired(); });
  planes_.push_back(std::move(plane));
}

void ReturnWindow::at_end_of_turn() {
  if (scheduled_) return;
  scheduled_ = true;
  end_of_turn_.add(kj::evalLast([this] {
    scheduled_ = false;
    sent_this_turn_ = 0;
    for (const std::weak_ptr<DataPlane>& p : planes_)
      if (auto plane = p.lock()) plane->writable();
  }));
}

void ReturnWindow::taskFailed(kj::Exception&& exception) {
  kj::throwFatalException(kj::mv(exception));  // a bug: at_end_of_turn throws nothing
}

void ReturnWindow::close() {
  if (connection_) connection_->on_written(nullptr);
  connection_ = nullptr;
  planes_.clear();
}

}  // namespace psched
