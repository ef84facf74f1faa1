// SPDX-License-Identifier: Apache-2.0
// StreamWrapper: wraps each of a Client's shard connections before TLS sees it (benchmarks
// shape bandwidth with it: bench/shaped_link.h). ClientOptions::wrap_stream holds one behind a
// forward declaration, so client/client.h needs no KJ; whoever sets it includes this header.
#pragma once

#include <kj/async-io.h>
#include <kj/timer.h>

namespace psched {

class StreamWrapper {
 public:
  virtual ~StreamWrapper() = default;
  // Called on the client's loop thread for every connection it opens, reconnects included;
  // `timer` is that thread's and outlives the stream.
  virtual kj::Own<kj::AsyncIoStream> wrap(kj::Own<kj::AsyncIoStream> stream, kj::Timer& timer) = 0;
};

}  // namespace psched
