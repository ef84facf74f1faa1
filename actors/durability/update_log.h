// SPDX-License-Identifier: Apache-2.0
// The update log's file format, its writer and its reader (ShardStore uses both).
//
//   header  "PSCHDLG3" | generation u64 | crc32 of the 16 bytes before       (20 bytes)
//   record  size u64 | crc32 of size | crc32 of payload | payload            (16 + size bytes)
//
// The size has a checksum of its own, so a damaged size field is told from a record cut short
// by a crash: only the second is a torn tail. Logs of earlier formats (PSCHDLG1, 2: other
// records, from development builds before any release) are refused, naming their format.
//
// UpdateLogWriter never leaves a partial record between whole ones: when an append fails (disk
// full, file size limit, I/O error) it cuts the file back to its last whole record before
// failing, and refuses further appends until that cut succeeded (Redis's AOF does the same
// after a short write). So everything after a torn record was never acknowledged.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "common/byte_codec.h"

namespace psched {

inline constexpr uint64_t kLogHeaderBytes = 20;
inline constexpr uint64_t kLogRecordHeaderBytes = 16;

// Appends records to one log file. Not thread-safe (the shard's strand owns it).
class UpdateLogWriter {
 public:
  // Creates `file` (replacing one of that name) with its header. Throws Error(io_error) naming
  // the file and the OS error; no file is left behind then.
  UpdateLogWriter(std::filesystem::path file, uint64_t generation);
  ~UpdateLogWriter();
  UpdateLogWriter(const UpdateLogWriter&) = delete;
  UpdateLogWriter& operator=(const UpdateLogWriter&) = delete;

  // Appends one whole record, or nothing: on failure the file is cut back to its last whole
  // record and Error(io_error) names the file, the OS error and that the update was not
  // logged. A failure is logged once (with the file name), and so is the first success after.
  void append(std::span<const std::byte> record);

  const std::filesystem::path& file() const { return file_; }
  uint64_t generation() const { return generation_; }
  uint64_t size() const { return whole_bytes_; }  // bytes of whole records and the header

 private:
  // Cuts the file back to whole_bytes_; false (errno set) when that failed.
  bool cut_back();

  std::filesystem::path file_;
  uint64_t generation_;
  int fd_ = -1;
  uint64_t whole_bytes_ = 0;
  bool torn_ = false;            // a failed append left bytes after whole_bytes_
  uint64_t failed_appends_ = 0;  // since the last success
};

// What reading one log found. Stops at the first bad place.
struct LogScan {
  uint64_t records = 0;     // whole records read (and applied, when asked)
  uint64_t good_bytes = 0;  // where the whole records end
  uint64_t file_bytes = 0;  // the file's size
  // Empty when the log reads whole to its end. Otherwise what is wrong at `bad_at`.
  std::string problem;
  uint64_t bad_at = 0;
  // The problem is a record (or header) cut short at the end of the file, or a tail of zero
  // bytes: what a crash in the middle of an append leaves. Anything else is damage.
  bool torn_tail = false;
};

// Reads `file`, expected to be generation `generation`'s log, calling `apply` with each whole
// record in order (null: only count them). `apply` throwing Error(corrupt_checkpoint) or any
// other error stops the scan there as damage ("record at byte N cannot be replayed: ...").
// Throws Error(corrupt_checkpoint) when the file cannot be read at all.
LogScan scan_log(const std::filesystem::path& file, uint64_t generation,
                 const std::function<void(ByteReader&)>& apply);

}  // namespace psched
