// SPDX-License-Identifier: Apache-2.0
// AnswerOrder: the order in which one connection's poll answers leave the shard. An answer
// whose value is ready goes out at once while the connection has less than `window` bytes
// queued to write; beyond that, ready answers wait here and leave best priority first (the
// layers nearest the input), so a first-layer value never queues behind megabytes of
// last-layer values that were ready earlier. Lives on the shard's loop with its connection.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include <kj/async.h>

#include "common/types.h"
#include "net/rpc_connection.h"

namespace psched {

class AnswerOrder final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
 public:
  // More than a few partitions of the default 256 KiB: the socket stays fed while answers wait.
  static constexpr uint64_t kDefaultWindow = 1 << 20;

  explicit AnswerOrder(uint64_t window = kDefaultWindow) : window_(window), end_of_turn_(*this) {}

  // Orders the answers that leave through `connection` (which calls close() before it goes).
  void serve(RpcConnection& connection);

  // Sends an answer of about `bytes` (fulfils `send`, whose call then returns) now or when its
  // turn comes. An answer whose caller went away meanwhile is skipped.
  void submit(Priority priority, uint64_t bytes, kj::Own<kj::PromiseFulfiller<void>> send);
  // The connection is going: nothing more is sent (waiting answers are dropped).
  void close();

 private:
  struct Waiting {
    Priority priority;
    uint64_t sequence;
    uint64_t bytes;
    kj::Own<kj::PromiseFulfiller<void>> send;
  };
  struct Later {  // heap order: true when a goes after b
    bool operator()(const Waiting& a, const Waiting& b) const {
      return a.priority != b.priority ? a.priority > b.priority : a.sequence > b.sequence;
    }
  };
  // The connection wrote something: sends waiting answers while the window allows.
  void written();
  // Sends the best waiting answers while the connection's queue has room.
  void send_while_room();
  // Once the loop has run everything else: forgets sent_this_turn_ and sends what fits.
  void check_at_end_of_turn();
  void taskFailed(kj::Exception&& exception) override;

  RpcConnection* connection_ = nullptr;  // null before serve() and after close()
  uint64_t window_;
  uint64_t next_sequence_ = 0;
  bool closed_ = false;
  // Answers sent in this turn of the loop: Cap'n Proto queues their messages only in a later
  // turn, so they count against the window until the loop has run everything else.
  uint64_t sent_this_turn_ = 0;
  bool check_scheduled_ = false;
  kj::TaskSet end_of_turn_;  // the scheduled check
  std::priority_queue<Waiting, std::vector<Waiting>, Later> waiting_;
};

}  // namespace psched
