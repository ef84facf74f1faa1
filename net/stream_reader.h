// SPDX-License-Identifier: Apache-2.0
// StreamReader: reads a framed byte stream through a buffer, for protocols parsed on the loop
// (the data stream, net/data_frame.h). Bytes already buffered are taken synchronously, so the
// frames that arrive together are parsed in one go; only a read that must wait for the peer
// costs a promise. Large bodies go from the socket straight into their destination.
//
// received() counts what arrived, for a watchdog that tells a slow peer from a silent one: it
// moves with every piece of a buffered read, and at least every MiB of a read straight into
// place (a body arriving slower than that per watchdog period looks silent). KJ thread only.
//
// Over a plain TCP socket, a read straight into place sleeps until a MiB (or the rest of the
// body, when less) has arrived, instead of waking for every segment: it raises the socket's
// receive low-water mark (SO_RCVLOWAT) for the body, and drops it back to one byte before any
// other read waits (docs/benchmarks.md, "Transport": a 1 MiB round trip's context switches
// halve). Only on Linux 5.11 and later: earlier kernels lacked fixes that wake a reader under
// the mark when the receive window or memory runs out, and could leave it asleep for good.
#pragma once

#include <cstddef>
#include <cstdint>

#include <kj/async-io.h>

namespace psched {

class StreamReader {
 public:
  static constexpr size_t kBufferBytes = 64 * 1024;

  // Whether this kernel lets a reader sleep under a low-water mark safely (see above).
  static bool can_mark_sockets();

  // Reads `stream`, which outlives the reader, through a buffer of `buffer_bytes`. With
  // `plain_socket`, `stream` is a TCP socket that only this reader reads and that nothing sits
  // on which holds bytes (TLS, a wrapper): the low-water mark must never ask for more bytes
  // than will come. Without a descriptor (getFd()), on a kernel that cannot, or where the socket
  // refuses its first mark, it is read as a stream.
  explicit StreamReader(kj::AsyncIoStream& stream, size_t buffer_bytes = kBufferBytes,
                        bool plain_socket = false);

  // Bytes buffered and not yet taken.
  size_t buffered() const { return end_ - begin_; }
  // Bytes read from the stream so far, taken or not.
  uint64_t received() const { return received_; }

  // Copies the next `n` buffered bytes to `out`; n <= buffered().
  void take(void* out, size_t n);
  // Resolves with true once at least `min` bytes are buffered (min <= the buffer's size), or
  // with false when the stream ends first; what arrived stays buffered.
  kj::Promise<bool> fill(size_t min);
  // Reads the next `n` bytes into `out`: the buffered ones are copied, the rest read straight
  // into `out` when it is at least the buffer's size. Fails with DISCONNECTED when the stream
  // ends first.
  kj::Promise<void> read(void* out, size_t n);
  // The same, but null when all `n` bytes were buffered (they are in `out` on return): the
  // caller goes on at once instead of in a later turn.
  kj::Maybe<kj::Promise<void>> read_or_wait(void* out, size_t n);
  // Reads and drops the next `n` bytes.
  kj::Promise<void> skip(uint64_t n);

 private:
  // Drops the next `n` buffered bytes; n <= buffered().
  void consume(size_t n);
  // Reads `n` bytes straight into `out`, a MiB or more at a time.
  kj::Promise<void> read_direct(kj::byte* out, size_t n);
  // The same over the plain socket: each read sleeps until a MiB or all `n` have arrived.
  kj::Promise<void> read_direct_marked(kj::byte* out, size_t n);
  // Sets the socket's receive low-water mark; false when the socket refuses it.
  bool set_low_water(size_t bytes);

  kj::AsyncIoStream& stream_;
  int socket_fd_ = -1;    // the plain socket's; -1: no low-water mark
  size_t low_water_ = 1;  // the socket's mark, as last set
  kj::Array<kj::byte> buffer_;
  size_t begin_ = 0, end_ = 0;  // the buffered bytes not yet taken
  uint64_t received_ = 0;
};

}  // namespace psched
