// SPDX-License-Identifier: Apache-2.0
// ByteWriter and ByteReader: the plain binary encoding of checkpoints and update logs.
// Fixed-width integers and doubles in the host's (little-endian) byte order; blobs and text
// carry a 64-bit length first. A reader never reads past its span: running short throws
// Error(corrupt_checkpoint) naming what was being read and where.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace psched {

static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian");

class ByteWriter {
 public:
  template <typename T>
  requires std::is_arithmetic_v<T>
  void put(T value) { raw(std::as_bytes(std::span(&value, 1))); }
  void raw(std::span<const std::byte> bytes) {
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
  void blob(std::span<const std::byte> bytes) {
    put<uint64_t>(bytes.size());
    raw(bytes);
  }
  void text(std::string_view s) { blob(std::as_bytes(std::span(s.data(), s.size()))); }

  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

// Bytes read in order from somewhere too large to hold at once: a checkpoint's table rows,
// read from its file (actors/durability/file_io.h, FileSource).
class ByteSource {
 public:
  // The next out.size() bytes into `out`; throws Error(corrupt_checkpoint) naming the source
  // and where it ran short when fewer are left.
  virtual void read(std::span<std::byte> out) = 0;

 protected:
  ~ByteSource() = default;
};

class ByteReader {
 public:
  // `what` names the source in errors ("checkpoint /data/shard-0-000003.ckpt").
  ByteReader(std::span<const std::byte> in, std::string what) : in_(in), what_(std::move(what)) {}

  template <typename T>
  requires std::is_arithmetic_v<T> T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
    return value;
  }
  // The next `n` bytes, a view into the input.
  std::span<const std::byte> take(uint64_t n) {
    if (n > in_.size() - at_)
      fail(ErrorCode::corrupt_checkpoint, "{}: truncated at byte {} (needs {} more, has {})", what_,
           at_, n, in_.size() - at_);
    auto out = in_.subspan(at_, n);
    at_ += n;
    return out;
  }
  std::span<const std::byte> blob() { return take(get<uint64_t>()); }
  std::string text() {
    auto bytes = blob();
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  bool done() const { return at_ == in_.size(); }
  uint64_t position() const { return at_; }
  const std::string& what() const { return what_; }

 private:
  std::span<const std::byte> in_;
  uint64_t at_ = 0;
  std::string what_;
};

// The rest of a ByteReader as a ByteSource: each read takes the next bytes from it (a
// checkpoint whose rows are inline, or a stream held in memory).
class ReaderSource final : public ByteSource {
 public:
  explicit ReaderSource(ByteReader& in) : in_(in) {}
  void read(std::span<std::byte> out) override {
    std::memcpy(out.data(), in_.take(out.size()).data(), out.size());
  }

 private:
  ByteReader& in_;
};

}  // namespace psched
