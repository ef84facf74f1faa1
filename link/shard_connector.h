// SPDX-License-Identifier: Apache-2.0
// ShardConnector: opens a worker's byte stream to a shard over TCP, inside TLS when the
// deployment has a `tls` section (net/tls.h). KJ thread only; a reconnect may open again.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include "config/deployment.h"

namespace psched {

// Wraps a connected TCP stream before TLS sees it (benchmarks shape bandwidth with it).
using StreamWrap = std::function<kj::Own<kj::AsyncIoStream>(kj::Own<kj::AsyncIoStream>)>;

class ShardConnector {
 public:
  // `network` outlives the connector. With `tls`, reads its ca_file now (throws
  // Error(bad_config) naming the YAML key when it cannot be used).
  ShardConnector(kj::Network& network, const std::optional<TlsConfig>& tls);
  ~ShardConnector();

  // Connects to the shard at `address` ("host:port"); the connector outlives the promise
  // (the stream may outlive the connector). Rejects with Error(disconnected) "cannot
  // connect to shard at <address>: ..." or with the handshake's error (tls_client_handshake).
  kj::Promise<kj::Own<kj::AsyncIoStream>> open(const std::string& address,
                                               const StreamWrap& wrap = {});

 private:
  kj::Network& network_;
  std::optional<TlsConfig> tls_;
  kj::Own<kj::TlsContext> context_;  // null without tls_
};

}  // namespace psched
