// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/update_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "actors/durability/file_io.h"
#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

// "PSCHDLG" and the format's digit; this build reads and writes the one format below.
constexpr char kMagicStem[7] = {'P', 'S', 'C', 'H', 'D', 'L', 'G'};
constexpr char kMagic[8] = {'P', 'S', 'C', 'H', 'D', 'L', 'G', '3'};

bool all_zero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

// Reads one record's payload at `at`, or says why not in `scan` (and returns nothing).
std::optional<std::span<const std::byte>> next_record(std::span<const std::byte> bytes, uint64_t at,
                                                      LogScan& scan) {
  const std::span<const std::byte> tail = bytes.subspan(at);
  std::span<const std::byte> rest = tail;
  auto stop = [&](std::string problem, bool torn) {
    scan.problem = std::move(problem);
    scan.bad_at = at;
    scan.torn_tail = torn || all_zero(tail);
    return std::nullopt;
  };
  uint64_t size = 0;
  uint32_t size_crc = 0, crc = 0;
  if (rest.size() < kLogRecordHeaderBytes)
    return stop(fmt::format("record header cut short ({} of its bytes)", rest.size()), true);
  std::memcpy(&size, rest.data(), 8);
  std::memcpy(&size_crc, rest.data() + 8, 4);
  std::memcpy(&crc, rest.data() + 12, 4);
  if (crc32_of(&size, sizeof size) != size_crc)
    return stop("record header fails its checksum", false);
  rest = rest.subspan(kLogRecordHeaderBytes);
  if (size > rest.size())
    return stop(fmt::format("record cut short ({} of its {} bytes)", rest.size(), size), true);
  auto payload = rest.first(size);
  if (crc32_of(payload.data(), payload.size()) != crc)
    return stop("record fails its checksum", false);
  return payload;
}

}  // namespace

UpdateLogWriter::UpdateLogWriter(std::filesystem::path file, uint64_t generation)
    : file_(std::move(file)), generation_(generation) {
  fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0)
    fail(ErrorCode::io_error, "creating update log {} failed: {}", file_.string(),
         std::strerror(errno));
  std::byte header[kLogHeaderBytes];
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &generation, 8);
  uint32_t crc = crc32_of(header, 16);
  std::memcpy(header + 16, &crc, 4);
  if (!write_all(fd_, {io(header, sizeof header)})) {
    int error = errno;
    ::close(fd_);
    std::filesystem::remove(file_);
    fail(ErrorCode::io_error, "writing update log {} failed: {}", file_.string(),
         std::strerror(error));
  }
  whole_bytes_ = kLogHeaderBytes;
}

UpdateLogWriter::~UpdateLogWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool UpdateLogWriter::cut_back() {
  while (::ftruncate(fd_, static_cast<off_t>(whole_bytes_)) != 0)
    if (errno != EINTR) return false;
  torn_ = false;
  return true;
}

void UpdateLogWriter::append(std::span<const std::byte> record) {
  if (torn_ && !cut_back())
    fail(ErrorCode::io_error,
         "update log {} cannot be written: an earlier write failed and cutting the file back to "
         "its last whole record (byte {}) fails: {}; no update is logged or acknowledged until "
         "it can be",
         file_.string(), whole_bytes_, std::strerror(errno));
  uint64_t size = record.size();
  uint32_t size_crc = crc32_of(&size, sizeof size), crc = crc32_of(record.data(), record.size());
  if (write_all(fd_, {io(&size, sizeof size), io(&size_crc, sizeof size_crc), io(&crc, sizeof crc),
                      io(record.data(), record.size())})) {
    whole_bytes_ += kLogRecordHeaderBytes + size;
    if (failed_appends_ > 0)
      log_info("update log {}: writable again after {} failed write(s)", file_.string(),
               failed_appends_);
    failed_appends_ = 0;
    return;
  }
  int error = errno;
  torn_ = true;
  bool cut = cut_back();
  std::string message = fmt::format(
      "writing update log {} failed: {}; the update was refused, not applied{}", file_.string(),
      std::strerror(error),
      cut ? fmt::format(", and the log cut back to its last whole record (byte {})", whole_bytes_)
          : fmt::format(", and cutting the log back to byte {} failed too: {}", whole_bytes_,
                        std::strerror(errno)));
  if (failed_appends_++ == 0)
    log_error("{} (further failures are not logged until one succeeds)", message);
  throw Error(ErrorCode::io_error, message);
}

LogScan scan_log(const std::filesystem::path& file, uint64_t generation,
                 const std::function<void(ByteReader&)>& apply) {
  std::vector<std::byte> bytes = read_file(file);
  LogScan scan;
  scan.file_bytes = bytes.size();
  std::span<const std::byte> all(bytes);
  uint64_t at = kLogHeaderBytes;
  if (bytes.size() < kLogHeaderBytes) {
    scan.problem =
        fmt::format("header cut short ({} of its {} bytes)", bytes.size(), kLogHeaderBytes);
    scan.torn_tail = true;
    return scan;
  }
  uint64_t written = 0;
  uint32_t crc = 0;
  std::memcpy(&written, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (std::memcmp(bytes.data(), kMagicStem, sizeof kMagicStem) == 0 &&
      bytes[sizeof kMagicStem] != std::byte(kMagic[sizeof kMagicStem])) {
    scan.problem = fmt::format(
        "an update log of format {}, written by an earlier development build; this build reads "
        "format {} only (docs/reliability.md)",
        static_cast<char>(bytes[sizeof kMagicStem]), kMagic[sizeof kMagicStem]);
    return scan;
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0 || crc32_of(bytes.data(), 16) != crc) {
    scan.problem = "not a psched update log (its header is damaged)";
    return scan;
  }
  if (written != generation) {
    scan.problem = fmt::format("its header says generation {}, not {}", written, generation);
    return scan;
  }
  scan.good_bytes = at;
  while (at < bytes.size()) {
    auto payload = next_record(all, at, scan);
    if (!payload) return scan;
    std::string what = fmt::format("{} record at byte {}", file.string(), at);
    if (apply) {
      try {
        ByteReader fields(*payload, what);
        apply(fields);
      } catch (const std::exception& e) {
        scan.problem = fmt::format("record cannot be replayed: {}", e.what());
        scan.bad_at = at;
        return scan;
      }
    }
    at += kLogRecordHeaderBytes + payload->size();
    scan.good_bytes = at;
    ++scan.records;
  }
  return scan;
}

}  // namespace psched
