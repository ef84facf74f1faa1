// SPDX-License-Identifier: Apache-2.0
#include "net/rpc_connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include "net/forwarding_stream.h"
#include "net/read_buffer.h"
#include "net/write_coalescing.h"

namespace psched {
namespace {

// Reports each completed write; everything else passes through.
class WriteWatch final : public ForwardingStream {
 public:
  WriteWatch(kj::Own<kj::AsyncIoStream> inner, std::shared_ptr<std::function<void()>> written)
      : ForwardingStream(kj::mv(inner)), written_(std::move(written)) {}

  kj::Promise<void> write(const void* buffer, size_t size) override {
    return watched(inner().write(buffer, size));
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return watched(inner().write(pieces));
  }

 private:
  kj::Promise<void> watched(kj::Promise<void> write) {
    return write.then([written = written_] {
      if (*written) (*written)();
    });
  }

  std::shared_ptr<std::function<void()>> written_;
};

}  // namespace

capnp::ReaderOptions reader_options(uint64_t max_message_bytes) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = (2 * max_message_bytes + (1 << 20)) / sizeof(capnp::word);
  return options;
}

kj::Own<kj::AsyncIoStream> without_nagle(kj::Own<kj::AsyncIoStream> stream) {
  int one = 1;
  // Throws "unimplemented" for streams that are not sockets; those have no Nagle to turn off.
  (void)kj::runCatchingExceptions(
      [&] { stream->setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); });
  return stream;
}

RpcConnection::RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap,
                             capnp::ReaderOptions options)
    : stream_(kj::heap<WriteWatch>(coalesced(kj::mv(stream)), written_)),
      network_(*stream_, capnp::rpc::twoparty::Side::SERVER, options),
      rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}

RpcConnection::RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::ReaderOptions options,
                             kj::Timer* timer)
    : stream_(coalesced(kj::mv(stream), timer)),
      network_(*stream_, capnp::rpc::twoparty::Side::CLIENT, options),
      rpc_(capnp::makeRpcClient(network_)) {}

kj::Own<kj::AsyncIoStream> RpcConnection::coalesced(kj::Own<kj::AsyncIoStream> stream,
                                                    kj::Timer* finish_timer) {
  auto writes = with_write_coalescing(with_read_buffer(without_nagle(kj::mv(stream))),
                                      kSmallWriteBytes, finish_timer);
  writes_ = writes.get();
  return writes;
}

kj::Promise<void> RpcConnection::on_disconnect() {
  return network_.onDisconnect().then([this] { return writes_->drained(); });
}

capnp::Capability::Client RpcConnection::bootstrap() {
  capnp::word scratch[4] = {};
  capnp::MallocMessageBuilder message(scratch);
  auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
  vat.setSide(capnp::rpc::twoparty::Side::SERVER);
  return rpc_.bootstrap(vat);
}

}  // namespace psched
