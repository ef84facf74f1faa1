// ShardThread: psched shards served from a dedicated thread of the benchmark process, wired
// as apps/psched_server.cc wires them (ShardHost + ActorRuntime + kj::setupAsyncIo), so a
// Client in the same process reaches them over real loopback sockets.
#pragma once

#include <exception>
#include <future>
#include <thread>

#include <kj/async-io.h>

#include "config/deployment.h"

namespace psched {
class ShardHost;
}

namespace psched::bench {

class ShardThread {
 public:
  // Hosts every shard of `config` with `actor_threads` threads applying updates. Returns once
  // the listeners are bound; throws what binding threw (psched::Error naming the address).
  ShardThread(DeploymentConfig config, unsigned actor_threads, unsigned apply_helpers);
  // Stops the listeners, fails waiting polls, stops the actors and joins. Clients should be
  // gone by then.
  ~ShardThread();
  ShardThread(const ShardThread&) = delete;
  ShardThread& operator=(const ShardThread&) = delete;

 private:
  // The KJ thread's whole life: serve until stop() fulfils `stop_`.
  void run(std::promise<void>& started);
  // KJ thread. Binds the listeners (running the loop until idle binds a numeric address),
  // signals `started`, and accepts until the destructor fulfils `stop_`. Throws only before
  // signalling: what binding threw.
  void serve(ShardHost& host, kj::AsyncIoContext& io, std::promise<void>& started);

  const DeploymentConfig config_;  // the ShardHost refers to it
  const unsigned actor_threads_;
  const unsigned apply_helpers_;
  const kj::Executor* executor_ = nullptr;    // the KJ thread's; set before `started`
  kj::Own<kj::PromiseFulfiller<void>> stop_;  // KJ thread only (the destructor goes via executor_)
  std::exception_ptr listen_error_;           // KJ thread
  std::thread thread_;
};

}  // namespace psched::bench
