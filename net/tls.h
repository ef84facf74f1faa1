// SPDX-License-Identifier: Apache-2.0
// TLS for the shard connections, on Cap'n Proto's kj-tls (kj/compat/tls.h; OpenSSL underneath,
// shipped by Debian's libcapnp-dev 0.9.2). Built from a deployment's `tls` section
// (config/deployment.h); docs/security.md says what it protects. KJ thread only.
#pragma once

#include <string>

#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include "config/deployment.h"

namespace psched {

// A shard server's context: presents cert_file, proven by key_file (TLS 1.2 or later). Reads
// both files now; throws Error(bad_config) "<yaml>:<line>: tls.<key>: '<path>' <what>" when one
// is missing, unreadable or holds no PEM, or the key is not the certificate's. Warns when the
// key file is readable by others.
kj::Own<kj::TlsContext> server_tls_context(const TlsConfig& config);

// A worker's context: trusts exactly the certificates in ca_file (not the system's store).
// Reads it now; throws as above.
kj::Own<kj::TlsContext> client_tls_context(const TlsConfig& config);

// The name a worker checks the certificate of the shard at `address` ("host:port") against:
// config.server_name, else the address's host. kj 0.9.2 matches it against the certificate's
// DNS names only (an IP address must be listed as a DNS name too).
std::string expected_server_name(const TlsConfig& config, const std::string& address);

// A worker's side of the handshake over `stream` to the shard at `address`. Resolves with the
// encrypted stream once the shard's certificate is trusted and names `server_name`. Rejects
// with Error "TLS handshake with shard at <address> failed: ...": bad_config when the
// certificate was refused, disconnected when the connection broke (a shard without TLS).
kj::Promise<kj::Own<kj::AsyncIoStream>> tls_client_handshake(kj::TlsContext& context,
                                                             kj::Own<kj::AsyncIoStream> stream,
                                                             const std::string& address,
                                                             const std::string& server_name);

}  // namespace psched
