// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/file_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/error.h"

namespace psched {

uint32_t crc32_of(const void* data, size_t size, uint32_t crc) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
}

iovec io(const void* data, size_t size) {
  return {const_cast<void*>(data), size};
}

bool write_all(int fd, std::vector<iovec> parts) {
  size_t next = 0;
  // Past empty parts, which writev() consumes without a byte (a 0 return): one left at the
  // end would be waited for for ever.
  auto skip_empty = [&] {
    while (next < parts.size() && parts[next].iov_len == 0) ++next;
  };
  skip_empty();
  while (next < parts.size()) {
    ssize_t n = ::writev(fd, parts.data() + next, static_cast<int>(parts.size() - next));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    for (auto left = static_cast<size_t>(n); left > 0 && next < parts.size();) {
      size_t used = std::min(left, parts[next].iov_len);
      parts[next].iov_base = static_cast<char*>(parts[next].iov_base) + used;
      parts[next].iov_len -= used;
      left -= used;
      if (parts[next].iov_len == 0) ++next;
    }
    skip_empty();
  }
  return true;
}

void rename_to_new(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno == EINVAL || errno == ENOSYS) {  // a file system without RENAME_NOREPLACE
    if (!std::filesystem::exists(to)) {
      std::filesystem::rename(from, to);
      return;
    }
    errno = EEXIST;
  }
  if (errno == EEXIST || errno == ENOTEMPTY)
    fail(ErrorCode::bad_config, "{} exists (made while it was written); nothing of it replaced",
         to.string());
  fail(ErrorCode::io_error, "renaming {} to {} failed: {}", from.string(), to.string(),
       std::strerror(errno));
}

std::vector<std::byte> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be opened", file.string());
  std::vector<std::byte> bytes(std::filesystem::file_size(file));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be read", file.string());
  return bytes;
}

void read_at(int fd, const std::filesystem::path& file, uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail(ErrorCode::corrupt_checkpoint, "{}: cannot read {} bytes at byte {}", file.string(),
           out.size(), offset);
    done += static_cast<size_t>(n);
  }
}

FileSource::FileSource(std::filesystem::path file, uint64_t offset, uint64_t length)
    : file_(std::move(file)), next_(offset), end_(offset + length) {
  fd_ = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be opened", file_.string());
}

FileSource::~FileSource() {
  ::close(fd_);
}

void FileSource::read(std::span<std::byte> out) {
  while (!out.empty()) {
    if (at_ == buffer_.size()) {
      if (next_ == end_)
        fail(ErrorCode::corrupt_checkpoint, "{}: truncated at byte {} (needs {} more)",
             file_.string(), end_, out.size());
      buffer_.resize(std::min<uint64_t>(kBufferBytes, end_ - next_));
      read_at(fd_, file_, next_, buffer_);
      next_ += buffer_.size();
      at_ = 0;
    }
    const size_t n = std::min(out.size(), buffer_.size() - at_);
    std::memcpy(out.data(), buffer_.data() + at_, n);
    at_ += n;
    out = out.subspan(n);
  }
}

}  // namespace psched
