// SPDX-License-Identifier: Apache-2.0
// export_model: a stopped job's trained model, out of its checkpoints into a folder that the
// PyTorch world reads without psched (`psched export`, apps/psched_cli.cc; psched.torch.to_local
// builds a plain torch module from it; docs/embeddings.md, "Export and serve"):
//
//   manifest.json               what is where, and what the model is (below)
//   dense/<name>.npy            each dense variable, whole, in its shape and dtype
//   tables/<name>/ids.npy       each table's stored rows' ids, (rows,): int64 (which
//                               torch.from_numpy takes) unless num_embeddings > 2^63: uint64
//   tables/<name>/values.npy    their values: (rows, dim), the table's dtype; row k is id ids[k]'s
// and only with `with_optimizer_state`:
//   dense_state/<name>.<k>.npy  a dense variable's optimizer state slot k, in its shape
//                               (optim/optimizer.h's slot order: momentum_buffer; exp_avg, ...);
//                               a directory of their own, so no variable's name makes another's
//                               file name
//   tables/<name>/state.npy     the rows' optimizer state: (rows, state_elements), row k of
//                               ids[k] (optim/row_optimizer.h's order: adagrad's sums, ...)
//   resume.bin                  what `psched import` makes the job's shards of again besides
//                               the arrays (actors/shard/model_import.h): psched's own records
//                               of the job's placement, membership and steps, and each
//                               variable's and table's spec, parts, step records and capacity
// <name> is the variable's or table's name with every byte but [A-Za-z0-9_.-] (and a leading
// '.') written %XX; the manifest gives each file's path, relative to the folder.
//
// Numpy's .npy with a JSON manifest rather than torch.save's pickle: a .npy file is a short
// header and the raw array, so numpy.load(mmap_mode="r") maps a table of any size without
// reading it, torch.from_numpy wraps that without a copy, and neither needs psched, torch or a
// trusted pickle; it can also be written a chunk at a time, which a pickle cannot.
//
// The rows: a table stores the rows that were updated at least once (and not evicted since);
// every other row holds its initial value, a function of the manifest's init and seed and the id
// (actors/shard/row_init.h), which a reader computes instead of reading. The rows are in storage
// order ("row_order": "storage"): shard 0's first, each shard's in the order it stored them;
// the ids are unique, not sorted.
//
// The manifest (format "psched-export", version kExportVersion): the job's identity (16 hex
// digits), mode, workers, step (the newest complete step of any variable or table), the slot
// map's epoch and shard count, the checkpoint files and the checkpoint format it came from,
// whether optimizer state is in; per dense variable its name, file, shape, dtype, step,
// optimizer (kind and hyper-parameters) and state files; per table its name, num_embeddings,
// dim, dtype, rows, init (kind, a, b), seed, max_rows, admit_after, step, row optimizer, and
// its ids (with ids_dtype), values and state files with state_elements; with optimizer state,
// "resume": the resume.bin file.
//
// Streamed: every shard's checkpoint is read as `psched reshard` reads it (checkpoint_set.h):
// the dense variables and table heads in memory, the rows from the files through a 1 MiB
// buffer; the rows go out a chunk of RowTable::kRowsPerChunk rows at a time. So the export
// holds the dense part, one chunk and that buffer, whatever the tables' size.
//
// A killed job's shards (updates logged after their checkpoints) are first restored from their
// logs as reshard's are, under ExportOptions::replay (checkpoint_set.h), into
// `to`.partial/restored/, removed before the rename; the manifest's "checkpoints" name the old
// checkpoints and its "replayed" each restored shard's replayed updates and what was lost.
//
// What it refuses, writing nothing, each with an Error(bad_config) naming what is wrong: a `to`
// that exists, and every set checkpoint_set.h refuses (a shard missing, two jobs, updates logged
// after a checkpoint with no replay settings, a checkpoint inside a step, ...). The folder is
// written as `to`.partial and renamed to `to` once whole; a failure removes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/shard/checkpoint_set.h"
#include "common/shard_settings.h"

namespace psched {

// The manifest's "version": what a reader of this layout checks.
inline constexpr uint32_t kExportVersion = 1;
// resume.bin: its name in the folder (the manifest's "resume"), first text and version.
inline constexpr std::string_view kResumeFile = "resume.bin";
inline constexpr std::string_view kResumeMagic = "psched-resume";
inline constexpr uint32_t kResumeVersion = 1;

struct ExportOptions {
  std::vector<std::filesystem::path> from;  // directories holding the job's checkpoints
  std::filesystem::path to;                 // the folder to write (must not exist)
  bool with_optimizer_state = false;        // also the optimizer state (the layout above)
  // The settings the job's servers ran with, under which a shard's logged updates are replayed
  // (CheckpointSetOptions::replay). Absent: a shard that needs a replay is refused.
  std::optional<ShardSettings> replay;
  std::string replay_source;  // names `replay` in messages ("--from-config deployment.yaml")
};

struct ExportReport {
  uint32_t shards = 0;  // the shards the job ran on
  uint64_t step = 0;    // the manifest's step
  uint64_t variables = 0, tables = 0;
  uint64_t rows = 0;                  // table rows written
  uint64_t bytes_written = 0;         // every file's, the manifest's included
  std::vector<ShardReplay> replayed;  // the shards restored from their logs
};

// Writes the model of the job whose checkpoints are in `options.from` into `options.to` (the
// layout above). Throws Error: bad_config for a set that cannot be exported or a `to` that
// exists, corrupt_checkpoint for a damaged file, io_error when writing fails; `options.to` is
// absent then.
ExportReport export_model(const ExportOptions& options);

}  // namespace psched
