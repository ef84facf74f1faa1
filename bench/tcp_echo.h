// SPDX-License-Identifier: Apache-2.0
// The benchmarks' baseline: a plain TCP echo over POSIX sockets (127.0.0.1 unless told), with
// TCP_NODELAY on both ends and buffers reused. A connection first sends its request size and how
// many distinct buffers both ends cycle through (8 bytes each, host order); the server then
// loops: read exactly that many bytes into its next buffer, write them back from it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/measurement.h"

namespace psched::bench {

// Serves each connection on a thread of its own, on an ephemeral port of `host` (an IPv4
// address; "0.0.0.0" for all of this network namespace's).
class TcpEchoServer {
 public:
  // Binds and listens before returning; throws std::system_error when it cannot.
  explicit TcpEchoServer(const std::string& host = "127.0.0.1");
  ~TcpEchoServer();  // stops accepting and joins (clients must have closed their connections)
  TcpEchoServer(const TcpEchoServer&) = delete;
  TcpEchoServer& operator=(const TcpEchoServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  void accept_loop();

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::vector<std::thread> connections_;  // accept thread only, until joined
};

// What a client's requests look like: `size` bytes each, request i sent from the client's
// buffer i mod `buffers`, echoed through the server's buffer i mod `buffers` and read into the
// client's response buffer i mod `buffers`. With one buffer each end reuses one hot buffer;
// with more the echo touches as much memory as psched does when a variable has that many
// partitions (a worker's gradient and value, the shard's variable), which no cache may hold.
struct EchoRequests {
  uint64_t size = 0;
  uint64_t buffers = 1;
};

// One connection to a TcpEchoServer. The constructor does what a measurement must not count:
// it connects, sends the header, touches every buffer of both ends and runs `budget.warmup`
// round trips, so several clients made first and measured at once start level.
class TcpEchoClient {
 public:
  TcpEchoClient(uint16_t port, EchoRequests requests, const Budget& budget,
                const std::string& host = "127.0.0.1");
  ~TcpEchoClient();
  TcpEchoClient(const TcpEchoClient&) = delete;
  TcpEchoClient& operator=(const TcpEchoClient&) = delete;

  // One request in flight: per iteration, write a request and read its echo.
  Measurement sequential();
  // `window` requests in flight: a writer thread keeps sending while fewer than `window`
  // responses are outstanding; the calling thread reads. Records no per-iteration times.
  // Bytes flow both ways at once: what the link carries up and down together.
  Measurement pipelined(unsigned window);

 private:
  struct Connection;
  std::unique_ptr<Connection> connection_;
  Budget budget_;
};

// A client made and measured at once, for a lone stream.
Measurement tcp_sequential(uint16_t port, EchoRequests requests, const Budget& budget);
Measurement tcp_pipelined(uint16_t port, EchoRequests requests, unsigned window,
                          const Budget& budget, const std::string& host = "127.0.0.1");

}  // namespace psched::bench
