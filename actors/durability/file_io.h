// SPDX-License-Identifier: Apache-2.0
// The file primitives a shard's checkpoints and update logs share: CRC-32, whole writes from
// several buffers, whole-file reads.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

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

}  // namespace psched
