// SPDX-License-Identifier: Apache-2.0
#include "link/shard_connector.h"

#include "common/error.h"
#include "net/tls.h"
#include "net/wire_convert.h"

namespace psched {

ShardConnector::ShardConnector(kj::Network& network, const std::optional<TlsConfig>& tls)
    : network_(network), tls_(tls) {
  if (tls_) context_ = client_tls_context(*tls_);
}

ShardConnector::~ShardConnector() = default;

kj::Promise<kj::Own<kj::AsyncIoStream>> ShardConnector::open(const std::string& address,
                                                             const StreamWrap& wrap) {
  auto connected =
      network_.parseAddress(address)
          .then([](kj::Own<kj::NetworkAddress> a) { return a->connect(); })
          .catch_([address](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
            kj::throwFatalException(to_kj_exception(std::make_exception_ptr(
                Error(ErrorCode::disconnected, fmt::format("cannot connect to shard at {}: {}",
                                                           address, e.getDescription().cStr())))));
          });
  return connected.then(
      [this, address,
       wrap](kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (wrap) stream = wrap(kj::mv(stream));
        if (!context_) return kj::mv(stream);
        return tls_client_handshake(*context_, kj::mv(stream), address,
                                    expected_server_name(*tls_, address));
      });
}

}  // namespace psched
