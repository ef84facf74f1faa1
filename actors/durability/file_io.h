// SPDX-License-Identifier: Apache-2.0
// The file primitives a shard's checkpoints and update logs share: CRC-32, whole writes from
// several buffers, whole-file reads.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "common/byte_codec.h"

namespace psched {

// CRC-32 (zlib's) of `size` bytes at `data`, continuing `crc` (the CRC of what came before).
uint32_t crc32_of(const void* data, size_t size, uint32_t crc = 0);
// An iovec over `size` bytes at `data` (only read from).
iovec io(const void* data, size_t size);
// Writes all of `parts` to `fd`, retrying short and interrupted writes; false (errno set) on
// an error.
bool write_all(int fd, std::vector<iovec> parts);
// The whole content of `file`; throws Error(corrupt_checkpoint) when it cannot be read.
std::vector<std::byte> read_file(const std::filesystem::path& file);
// Reads `size` bytes at `offset` of `fd` into `out`; throws Error(corrupt_checkpoint) naming
// `file` when they cannot be read (a short file, an I/O error).
void read_at(int fd, const std::filesystem::path& file, uint64_t offset, std::span<std::byte> out);

// Renames `from` to `to`, which must not exist: Error(bad_config) naming `to` when it does
// (made meanwhile: nothing of it is replaced, where rename() would replace an empty directory),
// Error(io_error) when the rename fails otherwise.
void rename_to_new(const std::filesystem::path& from, const std::filesystem::path& to);

// Writes a directory as a whole: removes `to` + `suffix` (an interrupted run's; beside `to`, also
// when `to` ends in a separator), calls `write(staging)` with that path, then renames it to `to`
// (rename_to_new). When anything throws, removes the staging directory and rethrows, so `to`
// appears whole or not at all (psched reshard, psched export).
template <typename Write>
void write_directory(const std::filesystem::path& to, const char* suffix, const Write& write) {
  const std::filesystem::path target = to.has_filename() ? to : to.parent_path();
  std::filesystem::path staging = target;
  staging += suffix;
  std::filesystem::remove_all(staging);
  try {
    write(staging);
    rename_to_new(staging, target);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(staging, ignored);
    throw;
  }
}

// `length` bytes of a file from `offset` on, read in order through a buffer of its own: what
// restores a checkpoint's table rows without holding the file in memory.
class FileSource final : public ByteSource {
 public:
  static constexpr size_t kBufferBytes = 1 << 20;
  // Throws Error(corrupt_checkpoint) when `file` cannot be opened.
  FileSource(std::filesystem::path file, uint64_t offset, uint64_t length);
  ~FileSource();
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  void read(std::span<std::byte> out) override;
  // Whether every byte of the range was read.
  bool done() const { return next_ == end_ && at_ == buffer_.size(); }

 private:
  std::filesystem::path file_;
  int fd_ = -1;
  uint64_t next_;  // the file offset the buffer's next refill starts at
  uint64_t end_;
  std::vector<std::byte> buffer_;
  size_t at_ = 0;  // read so far of buffer_
};

}  // namespace psched
