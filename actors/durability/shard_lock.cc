// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/shard_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace psched {
namespace {

// "pid 4242 on node-3\n": who holds a claim, written into the lock file.
std::string holder_line() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) std::strcpy(host.data(), "?");
  return fmt::format("pid {} on {}\n", getpid(), host.data());
}

// The holder the file names, without its newline ("unknown" when it names none).
std::string read_holder(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "unknown" : line;
}

}  // namespace

std::optional<ShardLock> ShardLock::try_take(const std::filesystem::path& directory, ShardId shard,
                                             std::string* holder) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error)  // as ShardStore says it
    fail(ErrorCode::bad_config, "checkpoint directory {} cannot be created: {}", directory.string(),
         error.message());
  std::filesystem::path file = file_of(directory, shard);
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(ErrorCode::bad_config, "{} cannot be opened: {}", file.string(), std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int why = errno;
    ::close(fd);
    if (why != EWOULDBLOCK)
      fail(ErrorCode::bad_config, "{} cannot be locked: {}", file.string(), std::strerror(why));
    if (holder) *holder = read_holder(file);
    return std::nullopt;
  }
  const std::string line = holder_line();
  // The name is for messages only: a claim stands whether or not it could be written.
  [[maybe_unused]] const bool named =
      ::ftruncate(fd, 0) == 0 && ::pwrite(fd, line.data(), line.size(), 0) == ssize_t(line.size());
  return ShardLock(fd, std::move(file));
}

std::filesystem::path ShardLock::file_of(const std::filesystem::path& directory, ShardId shard) {
  return directory / fmt::format("shard-{}.lock", shard.value);
}

ShardLock::ShardLock(ShardLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), file_(std::move(other.file_)) {}

ShardLock& ShardLock::operator=(ShardLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    file_ = std::move(other.file_);
  }
  return *this;
}

ShardLock::~ShardLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace psched
