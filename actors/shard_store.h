// ShardStore: one shard's files on disk, checkpoints and update logs, in one directory.
//
//   shard-<id>.<generation>.ckpt  everything the shard held at one moment (VariableShard
//                                 encodes it), checksummed (CRC-32)
//   shard-<id>.<generation>.log   every update accepted after that checkpoint, one
//                                 checksummed record each, appended before it is acknowledged
//
// Restoring = the newest checkpoint that passes its checksum, then the logs of its generation
// and later, in order. A checkpoint is written to a temporary file, fsynced and renamed, so a
// crash mid-write never replaces a good one; a log's torn last record (a crash mid-append) is
// where its replay stops. The previous generation is kept as a fallback until the next one
// is in place. Records reach the page cache before their update is acknowledged: a killed
// process loses nothing acknowledged; a machine crash may lose what the OS had not flushed
// (the checkpoints themselves are fsynced).
//
// Not thread-safe: the owning VariableShard uses it on its strand, except that
// write_checkpoint may run on another thread while the strand appends to the newer log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

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

  struct Checkpoint {
    uint64_t generation = 0;
    std::filesystem::path file;
    std::vector<std::byte> payload;  // what write_checkpoint was given
  };
  // The newest checkpoint that reads back whole and matches its checksum. Each one that does
  // not is named in `skipped` with the reason, and never used.
  std::optional<Checkpoint> load_latest(std::vector<std::string>& skipped) const;

  // Calls `apply` with each logged record of generation `from` and later, oldest first. A
  // record that fails its checksum or is cut short ends its log's replay and is named in
  // `skipped`. Returns the number of records replayed.
  uint64_t replay(uint64_t from, const std::function<void(ByteReader&)>& apply,
                  std::vector<std::string>& skipped) const;

  // Starts logging into generation `generation`'s log (new, empty), closing the previous log.
  // Call it, on the strand, at the moment the checkpoint of that generation is taken.
  void start_log(uint64_t generation);
  // Appends one record to the current log. Throws Error(internal) when the write fails.
  void append(std::span<const std::byte> record);
  bool logging() const { return log_fd_ >= 0; }

  // Writes generation `generation`'s checkpoint (temporary file, fsync, rename, fsync of the
  // directory), then deletes the files of generations older than the one before it and the
  // temporary files of interrupted writes.
  // Returns the checkpoint's path. Throws Error(internal) naming the file on failure.
  std::filesystem::path write_checkpoint(uint64_t generation,
                                         std::span<const std::byte> payload) const;

  std::filesystem::path checkpoint_file(uint64_t generation) const;
  std::filesystem::path log_file(uint64_t generation) const;

 private:
  // Generations that have a file with `suffix`, ascending.
  std::vector<uint64_t> generations(const std::string& suffix) const;
  void delete_before(uint64_t generation) const;

  std::filesystem::path directory_;
  ShardId shard_;
  int log_fd_ = -1;
};

}  // namespace psched
