// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/file_io.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
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
  }
  return true;
}

std::vector<std::byte> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be opened", file.string());
  std::vector<std::byte> bytes(std::filesystem::file_size(file));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be read", file.string());
  return bytes;
}

}  // namespace psched
