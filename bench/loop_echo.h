// SPDX-License-Identifier: Apache-2.0
// The transport benchmark's middle baseline: the echo of bench/tcp_echo.h carried the way
// psched carries a push. The caller's thread hands each request to a client event loop (a
// LoopThread, as Client has) and blocks on a future; that loop writes it over a KJ socket to a
// server event loop (a LoopThread, as a shard has), which writes it back; the client loop then
// wakes the caller. Same threads, hand-offs, loops and sockets as psched, without Cap'n Proto
// RPC, the optimizer apply, or the copy into the trainer's memory.
//
// So it against plain TCP is what the threads and event loops cost. With EchoWork::psched it
// also does psched's per-byte work: the server applies each request as a gradient to a value
// (sgd, as the transport bench's shard) and answers with the value, and the client copies each
// answer into its own memory, as a worker copies a fresh value into the trainer's; psched
// against that is what its RPC layer costs (docs/benchmarks.md, "Transport").
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

// What a loop echo does besides echoing (the client announces it with the request size).
enum class EchoWork : uint64_t { none = 0, psched = 1 };

// A client connection on its own event-loop thread (as a worker's Client has), for `size`-byte
// requests (a multiple of 4 bytes); exchange() is called from another thread. With
// EchoWork::psched each answer is copied into a memory of `requests` x `size` bytes.
class LoopEchoClient {
 public:
  LoopEchoClient(uint16_t port, uint64_t size, uint64_t requests, EchoWork work);
  ~LoopEchoClient();
  LoopEchoClient(const LoopEchoClient&) = delete;
  LoopEchoClient& operator=(const LoopEchoClient&) = delete;

  // `requests` echoes with at most `window` in flight, run on the loop; returns when the last
  // is back.
  void exchange(uint64_t requests, unsigned window);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// One request of `size` (a multiple of 4 bytes) per hand-off: the caller waits for its echo.
Measurement loop_sequential(uint16_t port, uint64_t size, EchoWork work, const Budget& budget);
// `requests` requests of `size` per hand-off, at most `window` in flight; the caller waits for
// the last echo (as psched's pipelined case pushes a variable of `requests` partitions with a
// credit of `window` partitions). One iteration moves requests x size bytes each way.
Measurement loop_pipelined(uint16_t port, uint64_t size, uint64_t requests, unsigned window,
                           EchoWork work, const Budget& budget);

}  // namespace psched::bench
