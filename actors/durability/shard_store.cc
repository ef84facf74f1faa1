// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/shard_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/ranges.h>

#include "actors/durability/file_io.h"
#include "common/check.h"
#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

// "PSCHDCK" and the format's digit, then crc32 of the body | body size u64 | body, where body =
// generation u64 | log follows u8 | payload size u64 | payload | the tables' rows.
constexpr char kCheckpointMagicStem[7] = {'P', 'S', 'C', 'H', 'D', 'C', 'K'};
constexpr char kCheckpointMagic[8] = {
    'P', 'S', 'C', 'H', 'D', 'C', 'K', static_cast<char>('0' + ShardStore::kCheckpointFormat)};

[[noreturn]] void fail_io(const char* what, const std::filesystem::path& file) {
  fail(ErrorCode::io_error, "{} {} failed: {}", what, file.string(), std::strerror(errno));
}

void fsync_path(const std::filesystem::path& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) fail_io("opening", path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_io("fsync of", path);
}

// Where a checkpoint's fields start: magic, crc32 of the body, the body's size, then the body.
constexpr uint64_t kCrcAt = sizeof kCheckpointMagic;
constexpr uint64_t kBodyAt = kCrcAt + sizeof(uint32_t) + sizeof(uint64_t);
// The body's fields before the payload: generation, whether its log follows, payload size.
constexpr uint64_t kBodyHeadBytes = sizeof(uint64_t) + sizeof(uint8_t) + sizeof(uint64_t);
constexpr size_t kCrcBlockBytes = 1 << 20;

// The CRC-32 of `size` bytes of `fd` from `offset`, read a block at a time.
uint32_t crc_of_range(int fd, const std::filesystem::path& file, uint64_t offset, uint64_t size) {
  std::vector<std::byte> block(std::min<uint64_t>(size, kCrcBlockBytes));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < size;) {
    std::span<std::byte> piece(block.data(), std::min<uint64_t>(block.size(), size - done));
    read_at(fd, file, offset + done, piece);
    crc = crc32_of(piece.data(), piece.size(), crc);
    done += piece.size();
  }
  return crc;
}

// An open file descriptor, closed with it.
struct OpenFile {
  int fd;
  explicit OpenFile(const std::filesystem::path& file) : fd(::open(file.c_str(), O_RDONLY)) {
    if (fd < 0) fail(ErrorCode::corrupt_checkpoint, "{}: cannot be opened", file.string());
  }
  ~OpenFile() { ::close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
};

// Reads the checkpoint's envelope and payload, checking the checksum over the whole body
// (rows too) without holding more than a block of it.
ShardStore::Checkpoint decode_checkpoint(const std::filesystem::path& file, uint64_t generation) {
  OpenFile open(file);
  std::array<std::byte, kBodyAt> head;
  read_at(open.fd, file, 0, head);
  ByteReader in(head, file.string());
  auto magic = in.take(sizeof kCheckpointMagic);
  const auto digit = static_cast<char>(magic[sizeof kCheckpointMagicStem]);
  if (std::memcmp(magic.data(), kCheckpointMagicStem, sizeof kCheckpointMagicStem) != 0)
    fail(ErrorCode::corrupt_checkpoint, "{}: not a psched checkpoint", file.string());
  if (digit != kCheckpointMagic[sizeof kCheckpointMagicStem])
    fail(ErrorCode::corrupt_checkpoint,
         "{}: a checkpoint of format {}, written by an earlier development build; this build "
         "reads format {} only (docs/reliability.md)",
         file.string(), digit, ShardStore::kCheckpointFormat);
  const uint32_t crc = in.get<uint32_t>();
  const uint64_t size = in.get<uint64_t>();
  if (std::filesystem::file_size(file) != kBodyAt + size ||
      crc_of_range(open.fd, file, kBodyAt, size) != crc)
    fail(ErrorCode::corrupt_checkpoint, "{}: checksum mismatch", file.string());
  ShardStore::Checkpoint out;
  out.generation = generation;
  out.file = file;
  std::array<std::byte, kBodyHeadBytes> fields_bytes;
  if (size < kBodyHeadBytes) fail(ErrorCode::corrupt_checkpoint, "{}: truncated", file.string());
  read_at(open.fd, file, kBodyAt, fields_bytes);
  ByteReader fields(fields_bytes, file.string());
  if (fields.get<uint64_t>() != generation)
    fail(ErrorCode::corrupt_checkpoint, "{}: holds another generation", file.string());
  out.log_follows = fields.get<uint8_t>() != 0;
  const uint64_t payload = fields.get<uint64_t>();
  if (payload > size - kBodyHeadBytes)
    fail(ErrorCode::corrupt_checkpoint, "{}: payload of {} bytes in a body of {}", file.string(),
         payload, size);
  out.payload.resize(payload);
  read_at(open.fd, file, kBodyAt + kBodyHeadBytes, out.payload);
  out.rows_offset = kBodyAt + kBodyHeadBytes + payload;
  out.rows_bytes = size - kBodyHeadBytes - payload;
  return out;
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

ShardStore::~ShardStore() = default;

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
    // 19 digits at most: a longer number is no generation of ours (and would overflow).
    if (number.empty() || number.size() > 19 ||
        !std::all_of(number.begin(), number.end(), ::isdigit))
      continue;
    out.push_back(std::stoull(number));
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t ShardStore::newest_generation() const {
  uint64_t newest = 0;
  for (const char* suffix : {".ckpt", ".log"})
    for (uint64_t g : generations(suffix)) newest = std::max(newest, g);
  return newest;
}

std::optional<ShardStore::Checkpoint> ShardStore::load_latest(
    std::vector<std::string>& skipped) const {
  auto found = generations(".ckpt");
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      return decode_checkpoint(checkpoint_file(*it), *it);
    } catch (const Error& e) {
      skipped.push_back(e.what());
    }
  }
  return std::nullopt;
}

std::string ShardStore::lose(uint64_t generation, uint64_t at, const std::string& problem,
                             const ReplayOptions& options) const {
  std::filesystem::path file = log_file(generation);
  std::string where =
      std::filesystem::exists(file)
          ? fmt::format("update log {} is damaged at byte {} ({}); the {} byte(s) from there on",
                        file.string(), at, problem, std::filesystem::file_size(file) - at)
          : fmt::format("update log {} is missing ({}); the updates it held", file.string(),
                        problem);
  uint64_t later = 0;
  std::vector<std::string> later_files;
  for (uint64_t g : generations(".log")) {
    if (g <= generation) continue;
    LogScan scan = scan_log(log_file(g), g, nullptr);
    later += scan.records;
    later_files.push_back(log_file(g).filename().string());
  }
  std::string message = fmt::format(
      "shard {}: {}{} were acknowledged to workers and would be lost", shard_.value, where,
      later_files.empty()
          ? std::string()
          : fmt::format(", and so would {} record(s) in {}", later, fmt::join(later_files, ", ")));
  if (!options.accept_loss)
    fail(ErrorCode::corrupt_checkpoint,
         "{}. Put the file back from a backup, or start psched-server with --accept-log-loss "
         "to go on from the last good record without them",
         message);
  return message;
}

void ShardStore::cut_torn_tail(const std::filesystem::path& file, uint64_t generation,
                               const LogScan& scan) const {
  if (scan.good_bytes < kLogHeaderBytes) {
    UpdateLogWriter rewritten(file, generation);  // an empty log with a whole header
    return;
  }
  std::error_code error;
  std::filesystem::resize_file(file, scan.good_bytes, error);
  if (error)
    fail(ErrorCode::io_error, "cutting the torn tail off update log {} failed: {}", file.string(),
         error.message());
}

ShardStore::ReplayOutcome ShardStore::replay(const Checkpoint* from,
                                             const std::function<void(ByteReader&)>& apply,
                                             ReplayOptions options) {
  ReplayOutcome out;
  std::vector<uint64_t> logs = generations(".log");
  if (!from) {  // a first start; a log with records but no checkpoint lost its checkpoint
    for (uint64_t g : logs)
      if (scan_log(log_file(g), g, nullptr).records > 0) {
        out.lost = lose(g, kLogHeaderBytes, "no checkpoint precedes it", options);
        break;
      }
    return out;
  }
  uint64_t newest_log = logs.empty() ? 0 : logs.back();
  uint64_t newest = newest_generation();
  for (uint64_t g = from->generation; g <= newest; ++g) {
    bool expected = g == from->generation ? from->log_follows : options.expect_logs;
    if (!std::binary_search(logs.begin(), logs.end(), g)) {
      if (!expected) continue;
      out.lost = lose(g, 0,
                      g == from->generation
                          ? fmt::format("checkpoint {} says it follows", from->file.string())
                          : std::string("a later generation exists"),
                      options);
      return out;
    }
    std::filesystem::path file = log_file(g);
    LogScan scan = scan_log(file, g, apply);
    out.replayed += scan.records;
    if (scan.problem.empty()) continue;
    if (scan.torn_tail && g == newest_log) {
      cut_torn_tail(file, g, scan);
      out.dropped.push_back(fmt::format(
          "{}: dropped a torn last record at byte {} ({}), never acknowledged; the file is cut "
          "back to {} bytes",
          file.string(), scan.bad_at, scan.problem, scan.good_bytes));
      return out;
    }
    out.lost = lose(g, scan.bad_at, scan.problem, options);
    return out;
  }
  return out;
}

void ShardStore::start_log(uint64_t generation) {
  log_ = std::make_unique<UpdateLogWriter>(log_file(generation), generation);
}

void ShardStore::append(std::span<const std::byte> record) {
  log_->append(record);
}

std::filesystem::path ShardStore::write_checkpoint(uint64_t generation,
                                                   std::span<const std::byte> payload) const {
  return open_checkpoint(generation, payload, 0)->finish();
}

std::unique_ptr<ShardStore::CheckpointFile> ShardStore::open_checkpoint(
    uint64_t generation, std::span<const std::byte> payload, uint64_t rows_bytes) const {
  ByteWriter head;
  head.raw(std::as_bytes(std::span(kCheckpointMagic)));
  head.put<uint32_t>(0);  // the checksum, once the rows are in (finish)
  head.put<uint64_t>(kBodyHeadBytes + payload.size() + rows_bytes);
  head.put(generation);
  head.put<uint8_t>(std::filesystem::exists(log_file(generation)));
  head.put<uint64_t>(payload.size());
  std::unique_ptr<CheckpointFile> file(
      new CheckpointFile(*this, generation, head.bytes().size() + payload.size(), rows_bytes));
  if (!write_all(file->fd_, {io(head.bytes().data(), head.bytes().size()),
                             io(payload.data(), payload.size())}))
    fail_io("writing", file->temporary_);
  return file;
}

ShardStore::CheckpointFile::CheckpointFile(const ShardStore& store, uint64_t generation,
                                           uint64_t rows_offset, uint64_t rows_bytes)
    : store_(store),
      generation_(generation),
      temporary_(store.checkpoint_file(generation)),
      rows_offset_(rows_offset),
      rows_bytes_(rows_bytes) {
  temporary_ += ".tmp";
  fd_ = ::open(temporary_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) fail_io("creating", temporary_);
}

ShardStore::CheckpointFile::~CheckpointFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ignored;
  std::filesystem::remove(temporary_, ignored);
}

void ShardStore::CheckpointFile::write_rows(uint64_t offset, std::span<const std::byte> bytes) {
  PSCHED_REQUIRE(offset + bytes.size() <= rows_bytes_, offset, bytes.size(), rows_bytes_);
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                         static_cast<off_t>(rows_offset_ + offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("writing", temporary_);
    done += static_cast<size_t>(n);
  }
}

std::filesystem::path ShardStore::CheckpointFile::finish() {
  const uint64_t size = rows_offset_ - kBodyAt + rows_bytes_;
  if (::ftruncate(fd_, static_cast<off_t>(kBodyAt + size)) != 0) fail_io("sizing", temporary_);
  const uint32_t crc = crc_of_range(fd_, temporary_, kBodyAt, size);
  if (::pwrite(fd_, &crc, sizeof crc, kCrcAt) != sizeof crc) fail_io("writing", temporary_);
  if (::fsync(fd_) != 0) fail_io("fsync of", temporary_);
  ::close(fd_);
  fd_ = -1;
  std::filesystem::path file = store_.checkpoint_file(generation_);
  if (::rename(temporary_.c_str(), file.c_str()) != 0) fail_io("renaming", temporary_);
  fsync_path(store_.directory_, O_RDONLY | O_DIRECTORY);
  if (generation_ > 0) store_.delete_before(generation_ - 1);
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
