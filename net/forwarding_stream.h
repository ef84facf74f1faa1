// SPDX-License-Identifier: Apache-2.0
// ForwardingStream: a kj::AsyncIoStream that passes every call to the stream it wraps.
// Wrappers under an RPC connection (a read buffer, a write watch, a frame deadline) derive
// from it and override only what they change.
#pragma once

#include <kj/async-io.h>

namespace psched {

class ForwardingStream : public kj::AsyncIoStream {
 public:
  explicit ForwardingStream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return inner_->tryRead(buffer, min, max);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }

 protected:
  kj::AsyncIoStream& inner() { return *inner_; }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
};

}  // namespace psched
