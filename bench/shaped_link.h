// SPDX-License-Identifier: Apache-2.0
// In-process bandwidth shaping for benchmarks on machines where tc is unavailable: a link of
// fixed rate that several streams share, and a stream wrapper that sends and receives through
// a worker's up- and downlink. KJ thread only (the shapers and streams of one client).
//
// The link is first-come-first-served: a write reserves the link for bytes / rate from the
// moment it is free and reaches the peer when its reservation ends, as a real NIC's queue would
// (no preemption inside a message: that is the partitioner's job). Streams move data in chunks
// of at most kChunkBytes, each shaped on its own, so the real copy of a large message overlaps
// the emulated transfer instead of adding to it.
#pragma once

#include <kj/async-io.h>
#include <kj/timer.h>

namespace psched::bench {

class LinkShaper {
 public:
  static constexpr kj::Duration kBurst = 2 * kj::MILLISECONDS;

  LinkShaper(kj::Timer& timer, double bytes_per_s) : timer_(timer), bytes_per_s_(bytes_per_s) {}

  // Resolves when `bytes` have crossed the link, after everything reserved before them.
  kj::Promise<void> transfer(size_t bytes);
  // Seconds the link has been busy so far.
  double busy_s() const { return busy_s_; }

 private:
  kj::Timer& timer_;
  double bytes_per_s_;
  kj::TimePoint free_at_ = kj::origin<kj::TimePoint>();
  double busy_s_ = 0;
};

// Writes go through `up` before reaching `inner`; reads are released at `down`'s pace. The
// shapers outlive the stream.
class ShapedStream final : public kj::AsyncIoStream {
 public:
  static constexpr size_t kChunkBytes = 256 << 10;

  ShapedStream(kj::Own<kj::AsyncIoStream> inner, LinkShaper& up, LinkShaper& down)
      : inner_(kj::mv(inner)), up_(up), down_(down) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;
  kj::Promise<void> write(const void* buffer, size_t size) override;
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override;
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }

 private:
  // Reads into buffer[done..] until at least `min_bytes` in all (or end of stream).
  kj::Promise<size_t> read_chunks(kj::byte* buffer, size_t min_bytes, size_t max_bytes,
                                  size_t done);
  kj::Promise<void> write_chunks(const kj::byte* data, size_t size);

  kj::Own<kj::AsyncIoStream> inner_;
  LinkShaper& up_;
  LinkShaper& down_;
};

}  // namespace psched::bench
