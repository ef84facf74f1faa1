// SPDX-License-Identifier: Apache-2.0
// The transport benchmark's middle baseline: the echo of bench/tcp_echo.h carried the way
// psched carries a push. The caller's thread hands each request to a client event loop (a
// LoopThread, as Client has) and blocks on a future; that loop writes it over a KJ socket to a
// server event loop (a LoopThread, as a shard has), which writes it back; the client loop then
// wakes the caller. Same threads, hand-offs, loops and sockets as psched, without Cap'n Proto
// RPC, the optimizer apply, or the copy into the trainer's memory.
//
// So psched against it is what the RPC layer and the shard's work cost, and it against plain
// TCP is what the threads and event loops cost (docs/benchmarks.md, "Transport").
#pragma once

#include <cstdint>
#include <memory>

#include "bench/measurement.h"

namespace psched::bench {

// Echoes every connection on one event-loop thread, on an ephemeral port of 127.0.0.1, with
// the protocol of TcpEchoServer (request size first, then exactly that many bytes back per
// request).
class LoopEchoServer {
 public:
  LoopEchoServer();  // listening when it returns
  ~LoopEchoServer();
  LoopEchoServer(const LoopEchoServer&) = delete;
  LoopEchoServer& operator=(const LoopEchoServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  struct Loop;
  std::unique_ptr<Loop> loop_;
  uint16_t port_ = 0;
};

// One request of `size` per hand-off: the caller waits for its echo.
Measurement loop_sequential(uint16_t port, uint64_t size, const Budget& budget);
// `requests` requests of `size` per hand-off, at most `window` in flight; the caller waits for
// the last echo (as psched's pipelined case pushes a variable of `requests` partitions with a
// credit of `window` partitions). One iteration moves requests x size bytes each way.
Measurement loop_pipelined(uint16_t port, uint64_t size, uint64_t requests, unsigned window,
                           const Budget& budget);

}  // namespace psched::bench
