#include "actors/shard_store.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"

namespace psched {
namespace {

constexpr char kCheckpointMagic[8] = {'P', 'S', 'C', 'H', 'D', 'C', 'K', '1'};
constexpr char kLogMagic[8] = {'P', 'S', 'C', 'H', 'D', 'L', 'G', '1'};

uint32_t crc_of(std::span<const std::byte> bytes) {
  return static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::vector<std::byte> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be opened", file.string());
  std::vector<std::byte> bytes(std::filesystem::file_size(file));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be read", file.string());
  return bytes;
}

[[noreturn]] void fail_io(const char* what, const std::filesystem::path& file) {
  fail(ErrorCode::internal, "{} {} failed: {}", what, file.string(), std::strerror(errno));
}

// Writes all of `parts` to `fd`, retrying short writes.
void write_all(int fd, std::vector<iovec> parts, const std::filesystem::path& file) {
  size_t next = 0;
  while (next < parts.size()) {
    ssize_t n = ::writev(fd, parts.data() + next, static_cast<int>(parts.size() - next));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io("writing", file);
    }
    for (auto left = static_cast<size_t>(n); left > 0 && next < parts.size();) {
      size_t used = std::min(left, parts[next].iov_len);
      parts[next].iov_base = static_cast<char*>(parts[next].iov_base) + used;
      parts[next].iov_len -= used;
      left -= used;
      if (parts[next].iov_len == 0) ++next;
    }
  }
}

iovec io(const void* data, size_t size) {
  return {const_cast<void*>(data), size};
}

void fsync_path(const std::filesystem::path& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) fail_io("opening", path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_io("fsync of", path);
}

}  // namespace

ShardStore::ShardStore(std::filesystem::path directory, ShardId shard)
    : directory_(std::move(directory)), shard_(shard) {
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error)
    fail(ErrorCode::bad_config, "checkpoint directory {} cannot be created: {}",
         directory_.string(), error.message());
}

ShardStore::~ShardStore() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

std::filesystem::path ShardStore::checkpoint_file(uint64_t generation) const {
  return directory_ / fmt::format("shard-{}.{:08}.ckpt", shard_.value, generation);
}

std::filesystem::path ShardStore::log_file(uint64_t generation) const {
  return directory_ / fmt::format("shard-{}.{:08}.log", shard_.value, generation);
}

std::vector<uint64_t> ShardStore::generations(const std::string& suffix) const {
  std::string prefix = fmt::format("shard-{}.", shard_.value);
  std::vector<uint64_t> out;
  for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(suffix)) continue;
    std::string number = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (number.empty() || !std::all_of(number.begin(), number.end(), ::isdigit)) continue;
    out.push_back(std::stoull(number));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<ShardStore::Checkpoint> ShardStore::load_latest(
    std::vector<std::string>& skipped) const {
  auto found = generations(".ckpt");
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    std::filesystem::path file = checkpoint_file(*it);
    try {
      std::vector<std::byte> bytes = read_file(file);
      ByteReader in(bytes, file.string());
      if (std::memcmp(in.take(sizeof kCheckpointMagic).data(), kCheckpointMagic,
                      sizeof kCheckpointMagic) != 0)
        fail(ErrorCode::corrupt_checkpoint, "{}: not a psched checkpoint", file.string());
      uint32_t crc = in.get<uint32_t>();
      auto payload = in.blob();
      if (!in.done() || crc_of(payload) != crc)
        fail(ErrorCode::corrupt_checkpoint, "{}: checksum mismatch", file.string());
      return Checkpoint{*it, file, {payload.begin(), payload.end()}};
    } catch (const Error& e) {
      skipped.push_back(e.what());
    }
  }
  return std::nullopt;
}

uint64_t ShardStore::replay(uint64_t from, const std::function<void(ByteReader&)>& apply,
                            std::vector<std::string>& skipped) const {
  uint64_t replayed = 0;
  for (uint64_t generation : generations(".log")) {
    if (generation < from) continue;
    std::filesystem::path file = log_file(generation);
    std::vector<std::byte> bytes = read_file(file);
    ByteReader in(bytes, file.string());
    try {
      if (std::memcmp(in.take(sizeof kLogMagic).data(), kLogMagic, sizeof kLogMagic) != 0)
        fail(ErrorCode::corrupt_checkpoint, "{}: not a psched update log", file.string());
      while (!in.done()) {
        uint64_t at = in.position();
        uint32_t crc = in.get<uint32_t>();
        auto record = in.blob();
        if (crc_of(record) != crc)
          fail(ErrorCode::corrupt_checkpoint, "{}: record at byte {} fails its checksum",
               file.string(), at);
        ByteReader fields(record, fmt::format("{} record at byte {}", file.string(), at));
        apply(fields);
        ++replayed;
      }
    } catch (const Error& e) {
      if (e.code() != ErrorCode::corrupt_checkpoint) throw;
      skipped.push_back(e.what());
    }
  }
  return replayed;
}

void ShardStore::start_log(uint64_t generation) {
  std::filesystem::path file = log_file(generation);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) fail_io("creating", file);
  if (log_fd_ >= 0) ::close(log_fd_);
  log_fd_ = fd;
  write_all(log_fd_, {io(kLogMagic, sizeof kLogMagic)}, file);
}

void ShardStore::append(std::span<const std::byte> record) {
  uint32_t crc = crc_of(record);
  uint64_t size = record.size();
  write_all(log_fd_, {io(&crc, sizeof crc), io(&size, sizeof size), io(record.data(), size)},
            directory_ / "(update log)");
}

std::filesystem::path ShardStore::write_checkpoint(uint64_t generation,
                                                   std::span<const std::byte> payload) const {
  std::filesystem::path file = checkpoint_file(generation);
  std::filesystem::path temporary = file;
  temporary += ".tmp";
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail_io("creating", temporary);
  uint32_t crc = crc_of(payload);
  uint64_t size = payload.size();
  try {
    write_all(fd,
              {io(kCheckpointMagic, sizeof kCheckpointMagic), io(&crc, sizeof crc),
               io(&size, sizeof size), io(payload.data(), size)},
              temporary);
    if (::fsync(fd) != 0) fail_io("fsync of", temporary);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), file.c_str()) != 0) fail_io("renaming", temporary);
  fsync_path(directory_, O_RDONLY | O_DIRECTORY);
  if (generation > 0) delete_before(generation - 1);
  return file;
}

void ShardStore::delete_before(uint64_t generation) const {
  // Temporary files of writes a crash interrupted (this shard writes one at a time).
  for (uint64_t g : generations(".ckpt.tmp")) {
    std::filesystem::path stale = checkpoint_file(g);
    stale += ".tmp";
    std::filesystem::remove(stale);
  }
  for (const char* suffix : {".ckpt", ".log"})
    for (uint64_t g : generations(suffix))
      if (g < generation)
        std::filesystem::remove(std::string(suffix) == ".ckpt" ? checkpoint_file(g) : log_file(g));
}

}  // namespace psched
