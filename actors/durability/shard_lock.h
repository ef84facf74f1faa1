// SPDX-License-Identifier: Apache-2.0
// ShardLock: a shard's claim on its checkpoint directory, so that two server processes never
// serve one shard, writing one update log, at once (a shard moved to another process while the
// old one still holds it; a second psched-server started on the same file by mistake).
//
// The claim is an exclusive flock(2) on `shard-<id>.lock` in the directory, which names its
// holder ("pid 4242 on node-3") for the message of whoever is refused. The kernel drops it when
// the holder exits, SIGKILL included, so a crash never leaves a shard claimed; on NFS (v4) the
// server keeps the lock for every client, as for fcntl's.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "common/types.h"

namespace psched {

class ShardLock {
 public:
  // Claims shard `shard` in `directory` (created when missing). Nothing when another process
  // holds it; then `holder`, when given, says who ("pid 4242 on node-3"). Throws
  // Error(bad_config) naming the directory when it cannot be created, or the file when it
  // cannot be opened.
  static std::optional<ShardLock> try_take(const std::filesystem::path& directory, ShardId shard,
                                           std::string* holder = nullptr);
  // The file that holds shard `shard`'s claim in `directory`.
  static std::filesystem::path file_of(const std::filesystem::path& directory, ShardId shard);
  ShardLock(ShardLock&& other) noexcept;
  ShardLock& operator=(ShardLock&& other) noexcept;
  ShardLock(const ShardLock&) = delete;
  ShardLock& operator=(const ShardLock&) = delete;
  ~ShardLock();  // releases the claim

  const std::filesystem::path& file() const { return file_; }

 private:
  ShardLock(int fd, std::filesystem::path file) : fd_(fd), file_(std::move(file)) {}
  int fd_ = -1;
  std::filesystem::path file_;
};

}  // namespace psched
