// The actor runtime: every actor owns its state and runs its handlers one at a time on a
// Boost.Asio strand. Other actors and threads talk to it only through its public methods,
// which hop onto the strand (or run at once when already on it). No locks inside actors.
//
// Lifetime: handlers capture `this`. The owner destroys an actor only after the io_context that
// runs its strand has stopped (ActorRuntime::stop, or the test's loop ends).
#pragma once

#include "common/asio.h"

#include <thread>
#include <vector>

namespace psched {

using IoContext = boost::asio::io_context;
using Strand = boost::asio::strand<IoContext::executor_type>;

class Actor {
 public:
  explicit Actor(IoContext& io) : strand_(boost::asio::make_strand(io)) {}
  // Shares `strand` with actors that always work together (a shard and its poll registry), so
  // they call each other without a hop.
  explicit Actor(const Strand& strand) : strand_(strand) {}
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // True inside one of this actor's handlers.
  bool on_strand() const { return strand_.running_in_this_thread(); }
  const Strand& strand() const { return strand_; }

 protected:
  // Queues `handler` on the strand (always a hop). Handlers may be move-only.
  template <typename Handler>
  void post(Handler&& handler) {
    boost::asio::post(strand_, std::forward<Handler>(handler));
  }
  // Runs `handler` at once when already on the strand, else queues it.
  template <typename Handler>
  void dispatch(Handler&& handler) {
    boost::asio::dispatch(strand_, std::forward<Handler>(handler));
  }

 private:
  Strand strand_;
};

// An io_context run by a fixed pool of threads, for processes (server, client library).
// Tests instead poll one io_context on their own thread for deterministic order.
class ActorRuntime {
 public:
  explicit ActorRuntime(unsigned threads);
  ~ActorRuntime();  // stops and joins

  IoContext& io() { return io_; }
  // Lets the threads finish queued handlers, then joins them. Idempotent.
  void stop();

 private:
  IoContext io_;
  boost::asio::executor_work_guard<IoContext::executor_type> work_;
  std::vector<std::thread> threads_;
};

}  // namespace psched
