// SPDX-License-Identifier: Apache-2.0
#include "bench/loop_echo.h"

#include <cstring>
#include <span>
#include <vector>

#include <kj/async-io.h>

#include "actors/runtime/loop_thread.h"
#include "net/rpc_connection.h"
#include "optim/optimizer.h"

namespace psched::bench {
namespace {

// What a client announces first.
struct Announcement {
  uint64_t size = 0;
  EchoWork work = EchoWork::none;
};

// One echoed connection: what it announced, the buffer each request arrives in, and with
// EchoWork::psched the value the requests are applied to, which is the answer.
struct EchoedConnection {
  kj::Own<kj::AsyncIoStream> stream;
  Announcement announced;
  kj::Array<kj::byte> buffer;
  std::vector<float> value;
  uint64_t applied = 0;

  // The answer to the request in `buffer`.
  kj::ArrayPtr<const kj::byte> answer() {
    if (announced.work == EchoWork::none) return buffer;
    std::span<const float> gradient(reinterpret_cast<const float*>(buffer.begin()), value.size());
    optim::apply({.kind = optim::OptimizerKind::sgd, .lr = 0.0}, value, gradient, {}, ++applied);
    return kj::arrayPtr(reinterpret_cast<const kj::byte*>(value.data()), buffer.size());
  }
};

// Reads a request, answers it, and again, until the peer closes.
kj::Promise<void> echo(EchoedConnection& c) {
  size_t size = c.buffer.size();
  return c.stream->tryRead(c.buffer.begin(), size, size).then([&c, size](size_t n) {
    if (n < size) return kj::Promise<void>(kj::READY_NOW);  // closed
    auto answer = c.answer();
    return c.stream->write(answer.begin(), answer.size()).then([&c] { return echo(c); });
  });
}

kj::Promise<void> serve(kj::Own<kj::AsyncIoStream> stream) {
  auto connection = kj::heap<EchoedConnection>();
  EchoedConnection& c = *connection;
  c.stream = without_nagle(kj::mv(stream));
  return c.stream->read(&c.announced, sizeof c.announced)
      .then([&c] {
        c.buffer = kj::heapArray<kj::byte>(c.announced.size);
        if (c.announced.work == EchoWork::psched) c.value.assign(c.announced.size / 4, 1.0f);
        return echo(c);
      })
      .attach(kj::mv(connection));
}

}  // namespace

class LoopEchoClient::Impl {
 public:
  Impl(uint16_t port, uint64_t size, uint64_t requests, EchoWork work)
      : request_(size, kj::byte{1}),
        response_(size),
        trainer_(work == EchoWork::psched ? requests * size : 0),
        announced_{size, work} {
    thread_.call([this, port](kj::AsyncIoContext& io) {
      return io.provider->getNetwork()
          .parseAddress("127.0.0.1", port)
          .then([](kj::Own<kj::NetworkAddress> address) { return address->connect(); })
          .then([this](kj::Own<kj::AsyncIoStream> stream) {
            stream_ = without_nagle(kj::mv(stream));
            return stream_->write(&announced_, sizeof announced_);
          });
    });
  }
  ~Impl() {
    thread_.call([this](kj::AsyncIoContext&) { stream_ = nullptr; });
  }

  void exchange(uint64_t requests, unsigned window) {
    thread_.call([this, requests, window](kj::AsyncIoContext&) {
      auto exchange = kj::heap<Exchange>(Exchange{requests, window});
      Exchange& x = *exchange;
      send_while_room(x);
      return receive(x).attach(kj::mv(exchange));
    });
  }

 private:
  struct Exchange {
    uint64_t requests;
    unsigned window;
    uint64_t sent = 0, received = 0;
    kj::Promise<void> writes = kj::READY_NOW;  // one write at a time, in order
  };

  void send_while_room(Exchange& x) {
    for (; x.sent < x.requests && x.sent - x.received < x.window; ++x.sent)
      x.writes = x.writes.then([this] { return stream_->write(request_.data(), request_.size()); })
                     .eagerlyEvaluate(nullptr);
  }

  kj::Promise<void> receive(Exchange& x) {
    if (x.received == x.requests) return kj::mv(x.writes);
    return stream_->read(response_.data(), response_.size()).then([this, &x] {
      if (!trainer_.empty())
        std::memcpy(trainer_.data() + x.received * response_.size(), response_.data(),
                    response_.size());
      ++x.received;
      send_while_room(x);
      return receive(x);
    });
  }

  LoopThread thread_{"echo-client"};
  std::vector<kj::byte> request_, response_, trainer_;
  Announcement announced_;             // written from here
  kj::Own<kj::AsyncIoStream> stream_;  // on the loop thread
};

LoopEchoClient::LoopEchoClient(uint16_t port, uint64_t size, uint64_t requests, EchoWork work)
    : impl_(std::make_unique<Impl>(port, size, requests, work)) {}

LoopEchoClient::~LoopEchoClient() = default;

void LoopEchoClient::exchange(uint64_t requests, unsigned window) {
  impl_->exchange(requests, window);
}

struct LoopEchoServer::Loop final : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&&) override {}  // a broken connection is dropped alone

  kj::Promise<void> accept() {
    return receiver->accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
      tasks->add(serve(kj::mv(stream)));
      return accept();
    });
  }

  LoopThread thread{"echo-server"};
  // On the loop thread; the tasks go first, as the accept loop uses the receiver:
  kj::Own<kj::ConnectionReceiver> receiver;
  kj::Own<kj::TaskSet> tasks;
};

LoopEchoServer::LoopEchoServer() : loop_(std::make_unique<Loop>()) {
  port_ = loop_->thread.call([this](kj::AsyncIoContext& io) {
    return io.provider->getNetwork()
        .parseAddress("127.0.0.1", 0)
        .then([this](kj::Own<kj::NetworkAddress> address) {
          loop_->receiver = address->listen();
          loop_->tasks = kj::heap<kj::TaskSet>(*loop_);
          loop_->tasks->add(loop_->accept());
          return uint16_t(loop_->receiver->getPort());
        });
  });
}

LoopEchoServer::~LoopEchoServer() {
  loop_->thread.call([this](kj::AsyncIoContext&) {
    loop_->tasks = nullptr;
    loop_->receiver = nullptr;
  });
}

Measurement loop_sequential(uint16_t port, uint64_t size, EchoWork work, const Budget& budget) {
  LoopEchoClient client(port, size, 1, work);
  return time_iterations(budget, size, [&] { client.exchange(1, 1); });
}

Measurement loop_pipelined(uint16_t port, uint64_t size, uint64_t requests, unsigned window,
                           EchoWork work, const Budget& budget) {
  LoopEchoClient client(port, size, requests, work);
  return time_iterations(budget, requests * size, [&] { client.exchange(requests, window); });
}

}  // namespace psched::bench
