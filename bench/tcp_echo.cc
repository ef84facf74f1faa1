// SPDX-License-Identifier: Apache-2.0
#include "bench/tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <exception>
#include <semaphore>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace psched::bench {
namespace {

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Owns a socket descriptor.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {
    if (fd_ < 0) throw_errno("socket");
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket& operator=(Socket&&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in ipv4(const std::string& host, uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1)
    throw std::system_error(EINVAL, std::generic_category(), "not an IPv4 address: " + host);
  return address;
}

void set_nodelay(int fd) {
  int on = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) != 0) throw_errno("TCP_NODELAY");
}

// Reads exactly `size` bytes; false when the peer closed before the first byte.
bool read_exact(int fd, std::byte* data, uint64_t size) {
  for (uint64_t done = 0; done < size;) {
    ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("read");
    if (n == 0 && done == 0) return false;
    if (n == 0) throw std::system_error(ECONNRESET, std::generic_category(), "read: short");
    done += uint64_t(n);
  }
  return true;
}

void write_all(int fd, const std::byte* data, uint64_t size) {
  for (uint64_t done = 0; done < size;) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("write");
    done += uint64_t(n);
  }
}

// `requests.buffers` buffers of `requests.size` bytes in one allocation, handed out in turn.
class BufferRing {
 public:
  BufferRing(EchoRequests requests, std::byte fill)
      : size_(requests.size), bytes_(requests.size * requests.buffers, fill) {}
  uint64_t size() const { return size_; }  // of each buffer
  std::byte* next() {
    std::byte* buffer = bytes_.data() + offset_;
    offset_ = (offset_ + size_) % bytes_.size();
    return buffer;
  }

 private:
  uint64_t size_;
  std::vector<std::byte> bytes_;
  uint64_t offset_ = 0;
};

// Server side of one connection: the header, then echo requests until the peer closes.
void serve_echo(int fd) {
  set_nodelay(fd);
  EchoRequests requests;
  if (!read_exact(fd, reinterpret_cast<std::byte*>(&requests), sizeof requests)) return;
  if (requests.size == 0 || requests.buffers == 0) return;  // nothing to echo
  BufferRing ring(requests, std::byte{0});
  for (std::byte* buffer = ring.next(); read_exact(fd, buffer, ring.size()); buffer = ring.next())
    write_all(fd, buffer, ring.size());
}

// A client connection that has sent its header.
Socket connect_echo(const std::string& host, uint16_t port, EchoRequests requests) {
  Socket socket(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address = ipv4(host, port);
  if (::connect(socket.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    throw_errno("connect");
  set_nodelay(socket.fd());
  write_all(socket.fd(), reinterpret_cast<const std::byte*>(&requests), sizeof requests);
  return socket;
}

// Reads the next echo into the next buffer of `responses`.
void read_response(int fd, BufferRing& responses) {
  if (!read_exact(fd, responses.next(), responses.size()))
    throw std::system_error(ECONNRESET, std::generic_category(), "echo server closed");
}

// One request out and its echo back, each through the next buffer of its ring.
void round_trip(int fd, BufferRing& requests, BufferRing& responses) {
  write_all(fd, requests.next(), requests.size());
  read_response(fd, responses);
}

}  // namespace

TcpEchoServer::TcpEchoServer(const std::string& host)
    : listen_fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
  if (listen_fd_ < 0) throw_errno("socket");
  sockaddr_in address = ipv4(host, 0);
  socklen_t length = sizeof address;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(listen_fd_);
    throw_errno("echo server bind/listen");
  }
  port_ = ntohs(address.sin_port);
  thread_ = std::thread([this] { accept_loop(); });
}

TcpEchoServer::~TcpEchoServer() {
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept() with an error (Linux)
  thread_.join();
  ::close(listen_fd_);
}

void TcpEchoServer::accept_loop() {
  for (;;) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) break;  // shut down
    connections_.emplace_back([fd] {
      Socket connection(fd);
      try {
        serve_echo(connection.fd());
      } catch (const std::system_error&) {
        // a broken connection is dropped alone; the client reports its own side
      }
    });
  }
  for (auto& connection : connections_) connection.join();
}

namespace {

// Tokens for the reading side: one per request written, then one more when writing ended.
struct PipelineState {
  explicit PipelineState(unsigned window) : window(window) {}
  std::counting_semaphore<> window;  // free request slots
  std::counting_semaphore<> sent_tokens{0};
  std::atomic<uint64_t> sent{0};
  std::exception_ptr writer_error;  // set by the writer before its end token
};

void write_requests(int fd, BufferRing& sent, const Budget& budget, PipelineState& state) {
  const auto start = BenchClock::now();
  try {
    while (!budget_spent(budget, state.sent.load(), start)) {
      state.window.acquire();
      write_all(fd, sent.next(), sent.size());
      state.sent.fetch_add(1);
      state.sent_tokens.release();
    }
  } catch (...) {
    state.writer_error = std::current_exception();
  }
  state.sent_tokens.release();  // the end token
}

// Reads responses until the end token; returns how many were read.
uint64_t read_responses(int fd, BufferRing& responses, PipelineState& state) {
  uint64_t received = 0;
  for (;;) {
    state.sent_tokens.acquire();
    if (received == state.sent.load()) return received;  // it was the end token
    read_response(fd, responses);
    ++received;
    state.window.release();
  }
}

}  // namespace

struct TcpEchoClient::Connection {
  Connection(const std::string& host, uint16_t port, EchoRequests requests)
      : socket(connect_echo(host, port, requests)),
        sent(requests, std::byte{1}),
        received(requests, std::byte{0}) {}

  void round_trip() { psched::bench::round_trip(socket.fd(), sent, received); }

  Socket socket;
  BufferRing sent, received;
};

TcpEchoClient::TcpEchoClient(uint16_t port, EchoRequests requests, const Budget& budget,
                             const std::string& host)
    : connection_(std::make_unique<Connection>(host, port, requests)), budget_(budget) {
  // The server's buffers are made once it has the header, before it echoes the first request.
  for (uint64_t i = 0; i < budget.warmup; ++i) connection_->round_trip();
  budget_.warmup = 0;
}

TcpEchoClient::~TcpEchoClient() = default;

Measurement TcpEchoClient::sequential() {
  return time_iterations(budget_, connection_->sent.size(), [&] { connection_->round_trip(); });
}

Measurement TcpEchoClient::pipelined(unsigned window) {
  Connection& c = *connection_;
  PipelineState state(window);
  Measurement m;
  m.bytes_per_iteration = c.sent.size();
  const ProcessUsage usage = ProcessUsage::now();
  const auto start = BenchClock::now();
  std::thread writer([&] { write_requests(c.socket.fd(), c.sent, budget_, state); });
  try {
    m.iterations = read_responses(c.socket.fd(), c.received, state);
  } catch (...) {
    ::shutdown(c.socket.fd(), SHUT_RDWR);  // the writer's next write fails; it ends
    state.window.release(window);
    writer.join();
    throw;
  }
  writer.join();
  if (state.writer_error) std::rethrow_exception(state.writer_error);
  m.seconds = seconds_between(start, BenchClock::now());
  usage.record_since(m);
  return m;
}

Measurement tcp_sequential(uint16_t port, EchoRequests requests, const Budget& budget) {
  return TcpEchoClient(port, requests, budget).sequential();
}

Measurement tcp_pipelined(uint16_t port, EchoRequests requests, unsigned window,
                          const Budget& budget, const std::string& host) {
  return TcpEchoClient(port, requests, budget, host).pipelined(window);
}

}  // namespace psched::bench
