// SPDX-License-Identifier: Apache-2.0
// ReturnWindow: how much one RPC connection's answers may have queued to write. Cap'n Proto
// sends a call's return as soon as the call completes, so the sessions on the connection
// complete calls (server/shard_service.h) only while less than `window` bytes are queued;
// beyond that their answers wait in their DataPlane, in priority order, and go when writes
// make room. Lives on the shard's loop with its connection.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <kj/async.h>

#include "net/rpc_connection.h"

namespace psched {

class DataPlane;

class ReturnWindow final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
 public:
  // More than a few partitions of the default 256 KiB: the socket stays fed while answers wait.
  static constexpr uint64_t kDefaultWindow = 1 << 20;

  explicit ReturnWindow(uint64_t window = kDefaultWindow) : window_(window), end_of_turn_(*this) {}

  // Measures `connection` (which calls close() before it goes).
  void serve(RpcConnection& connection);
  // Whether another answer may be completed now.
  bool has_room() const;
  // An answer of about `bytes` was completed.
  void sent(uint64_t bytes);
  // Tells `plane` each time room appears, while it lives.
  void watch(std::weak_ptr<DataPlane> plane);
  // The connection is going: no more room.
  void close();

 private:
  // Once the loop has run everything else: forgets sent_this_turn_ and tells the planes.
  void at_end_of_turn();
  void taskFailed(kj::Exception&& exception) override;

  RpcConnection* connection_ = nullptr;  // null before serve() and after close()
  uint64_t window_;
  // Answers completed in this turn of the loop: Cap'n Proto queues their messages only in a
  // later turn, so they count against the window until the loop has run everything else.
  uint64_t sent_this_turn_ = 0;
  bool scheduled_ = false;
  std::vector<std::weak_ptr<DataPlane>> planes_;
  kj::TaskSet end_of_turn_;  // the scheduled at_end_of_turn
};

}  // namespace psched
