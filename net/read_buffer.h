// SPDX-License-Identifier: Apache-2.0
// A read buffer under a Cap'n Proto connection. KJ 0.9 reads each message with two or three
// reads (frame header, segment table, body) and one more that finds the socket empty; through
// a buffer, the small messages that arrive together cost one read between them. Reads larger
// than the buffer go straight into the caller's memory, so large messages are not copied twice.
//
// Writes are gathered by the layer above (net/write_coalescing.h), at the end of a loop turn:
// holding a message until the write before it was done, tried first, doubled the 4 KiB round trip.
#pragma once

#include <cstddef>

#include <kj/async-io.h>

namespace psched {

// `stream` with reads served from a buffer of `bytes`; writes pass through.
kj::Own<kj::AsyncIoStream> with_read_buffer(kj::Own<kj::AsyncIoStream> stream,
                                            size_t bytes = 64 * 1024);

}  // namespace psched
