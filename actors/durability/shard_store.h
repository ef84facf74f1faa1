// SPDX-License-Identifier: Apache-2.0
// ShardStore: one shard's files on disk, checkpoints and update logs, in one directory.
//
//   shard-<id>.<generation>.ckpt  everything the shard held at one moment (ShardDurability
//                                 encodes it), checksummed (CRC-32), and whether an update log
//                                 follows it (generation <generation>'s)
//   shard-<id>.<generation>.log   every update accepted after that checkpoint, one
//                                 checksummed record each, appended before it is acknowledged
//                                 (actors/durability/update_log.h)
//
// Restoring = the newest checkpoint that passes its checksum, then the logs of its generation
// and later, in order. A checkpoint is written to a temporary file, fsynced and renamed, so a
// crash mid-write never replaces a good one. The previous generation is kept as a fallback
// until the next one is in place. Records reach the page cache before their update is
// acknowledged: a killed process loses nothing acknowledged; a machine crash may lose what the
// OS had not flushed (the checkpoints themselves are fsynced).
//
// What replay tells apart (etcd's WAL and Redis's AOF draw the same line):
//   - a torn tail: the newest log ends inside a record (or in zero bytes). A crash mid-append
//     leaves it, and that record was never acknowledged: it is dropped and the file cut back.
//   - damage: a record that fails a checksum or cannot be replayed with more after it, a torn
//     record in an older log, a log the checkpoint says follows it that is missing, a gap in
//     the generations. The updates after it were acknowledged, so replay refuses
//     (Error(corrupt_checkpoint) naming the file, the byte and what would be lost) unless the
//     operator accepts the loss (psched-server --accept-log-loss): then it stops there.
//
// Not thread-safe: the owning ShardDurability uses it on its shard's loop, except that
// write_checkpoint may run on another thread while the strand appends to the newer log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/durability/update_log.h"
#include "common/byte_codec.h"
#include "common/types.h"

namespace psched {

class ShardStore {
 public:
  // Creates `directory` when missing; throws Error(bad_config) when it cannot.
  ShardStore(std::filesystem::path directory, ShardId shard);
  ~ShardStore();
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // The format write_checkpoint writes and load_latest reads. Earlier formats (1 to 8) were
  // written by development builds before any release and are refused, naming their format.
  static constexpr uint32_t kCheckpointFormat = 9;

  struct Checkpoint {
    uint64_t generation = 0;
    std::filesystem::path file;
    std::vector<std::byte> payload;  // what write_checkpoint was given
    // Where in `file` the tables' rows are (CheckpointFile).
    uint64_t rows_offset = 0;
    uint64_t rows_bytes = 0;
    // Whether generation `generation`'s update log follows it.
    bool log_follows = false;
  };
  // The newest checkpoint that reads back whole and matches its checksum. Each one that does
  // not is named in `skipped` with the reason, and never used.
  std::optional<Checkpoint> load_latest(std::vector<std::string>& skipped) const;

  struct ReplayOptions {
    // Whether logs of generations after the checkpoint's are expected (no checkpoint of theirs
    // says): the deployment's checkpoint.update_log.
    bool expect_logs = true;
    // Go on after damage or a missing log (stopping replay there) instead of refusing.
    bool accept_loss = false;
  };
  struct ReplayOutcome {
    uint64_t replayed = 0;             // records applied
    std::vector<std::string> dropped;  // torn tails dropped (never acknowledged), with reasons
    std::string lost;                  // accept_loss: the damage gone past and what it lost
  };
  // Calls `apply` with each logged record that follows checkpoint `from` (null: none was
  // found; then no log may hold a record), oldest first. A torn tail of the newest log is
  // dropped and cut off the file. Damage, a missing log or a record `apply` rejects throws
  // Error(corrupt_checkpoint) naming the file, the byte and what would be lost, unless
  // options.accept_loss.
  ReplayOutcome replay(const Checkpoint* from, const std::function<void(ByteReader&)>& apply,
                       ReplayOptions options);
  // The highest generation any checkpoint or log of this shard has (0: none).
  uint64_t newest_generation() const;

  // Starts logging into generation `generation`'s log (new, empty), closing the previous log.
  // Call it, on the strand, at the moment the checkpoint of that generation is taken. Throws
  // Error(io_error) when the file cannot be created; the previous log stays in use then.
  void start_log(uint64_t generation);
  // Appends one record to the current log, or nothing: throws Error(io_error) naming the file
  // and the OS error when the write fails (UpdateLogWriter::append).
  void append(std::span<const std::byte> record);
  bool logging() const { return log_ != nullptr; }

  // Writes generation `generation`'s checkpoint (temporary file, fsync, rename, fsync of the
  // directory), recording whether that generation's log exists (start_log was called for it),
  // then deletes the files of generations older than the one before it and the
  // temporary files of interrupted writes.
  // Returns the checkpoint's path. Throws Error(io_error) naming the file on failure, and
  // removes the temporary file then.
  std::filesystem::path write_checkpoint(uint64_t generation,
                                         std::span<const std::byte> payload) const;

  // A checkpoint file being written: the payload first, then `rows_bytes` of table rows in
  // pieces at their offsets as they come (write_rows), then finish(), which checksums what was
  // written, syncs and renames it as write_checkpoint does. Off the loop (the writer thread).
  // Dropped unfinished, it removes its temporary file. Throws Error(io_error) naming the file.
  class CheckpointFile {
   public:
    ~CheckpointFile();
    CheckpointFile(const CheckpointFile&) = delete;
    CheckpointFile& operator=(const CheckpointFile&) = delete;
    // `bytes` at `offset` of the rows (they end within rows_bytes).
    void write_rows(uint64_t offset, std::span<const std::byte> bytes);
    std::filesystem::path finish();

   private:
    friend class ShardStore;
    CheckpointFile(const ShardStore& store, uint64_t generation, uint64_t rows_offset,
                   uint64_t rows_bytes);

    const ShardStore& store_;
    uint64_t generation_;
    std::filesystem::path temporary_;
    int fd_ = -1;
    uint64_t rows_offset_;  // in the file
    uint64_t rows_bytes_;
  };
  // Starts generation `generation`'s checkpoint: its payload written, its rows to come.
  std::unique_ptr<CheckpointFile> open_checkpoint(uint64_t generation,
                                                  std::span<const std::byte> payload,
                                                  uint64_t rows_bytes) const;

  std::filesystem::path checkpoint_file(uint64_t generation) const;
  std::filesystem::path log_file(uint64_t generation) const;

 private:
  // Generations that have a file with `suffix`, ascending.
  std::vector<uint64_t> generations(const std::string& suffix) const;
  void delete_before(uint64_t generation) const;
  // Refuses (or with accept_loss, describes) the loss starting at `at` in generation
  // `generation`'s log: `problem` says what is wrong there.
  std::string lose(uint64_t generation, uint64_t at, const std::string& problem,
                   const ReplayOptions& options) const;
  // Makes `scan`'s torn tail of `file` whole again: cut back to its whole records.
  void cut_torn_tail(const std::filesystem::path& file, uint64_t generation,
                     const LogScan& scan) const;

  std::filesystem::path directory_;
  ShardId shard_;
  std::unique_ptr<UpdateLogWriter> log_;  // the log being appended to; null when not logging
};

}  // namespace psched
