// SPDX-License-Identifier: Apache-2.0
// import_model: a job's export made into the checkpoints of M shards that start the job again
// where it stopped (`psched import`, apps/psched_cli.cc): on any number of shards, on another
// machine, or from a folder whose arrays were changed in numpy (a row's value, a dense
// variable's, their optimizer state). A job stopped, exported with its optimizer state and
// imported goes on bit for bit as it would have from its own checkpoints.
//
// The export must hold optimizer state (`psched export --with-optimizer-state`,
// psched.torch.export(..., with_optimizer_state=True)): its resume.bin (model_export.h) holds
// what the arrays do not, as the job's shards held it when it stopped:
//
//   text "psched-resume", u32 version
//   the checkpoint header of the job's shard 0 (job identity, mode, workers, slot map)
//   blob: the job's step machine record (checkpoint_set.h job_machine: its membership)
//   u64 dense variables, each: its spec (state_codec.h), u32 parts, each: u32 shard, its
//       element range, blob: its step record, blob: its sums record
//   u64 tables, each, a shard at a time, shard 0's first: blob: its head (spec, rows on that
//       shard, capacity: eviction order and admission counts), blob: step record, blob: sums
//
// Import writes, in `to`.import-partial/job/, the N checkpoints of the job's shards again: each
// dense part's values and optimizer state cut from its variable's .npy files, each table's rows
// (a shard's rows are the next ones of the table's ids, values and state .npy files: the export
// wrote them shard by shard) streamed a chunk of RowTable::kRowsPerChunk rows at a time, the
// rest from resume.bin. It then places those on M shards into `to` exactly as `psched reshard`
// places a job's checkpoints (reshard.h: rows to their slots' owners, dense variables whole or
// cut again, capacity merged, steps and membership kept; written under `to`.reshard-partial
// until whole) and removes the staging directory. It holds the dense part (each variable's
// arrays and parts: two to three times its size), resume.bin (a bounded table's eviction order
// is a number a row), a chunk of rows, and a 1 MiB read buffer for each of a table's arrays,
// whatever the tables' size; reshard then reads the staged checkpoints as it reads any.
//
// The specs (optimizers, init, capacity bounds) and the row counts come from resume.bin; the
// manifest and the arrays are checked against them. Values and optimizer state may be changed
// in numpy; ids and their order may not: each shard's rows must be the ones its slots give it,
// in the order it held them (a bounded table's eviction order names rows by their place). What
// it refuses, each with an Error naming the file and what is wrong, leaving nothing at `to`:
// bad_config for a folder without a psched-export manifest of this version or whose entries are
// not what export writes, an export without optimizer state (no resume.bin), a resume.bin of
// another version or of another model than the manifest (names, shapes, row counts), an array
// missing, no .npy file, or of another dtype or shape, a row id at or past its table's
// num_embeddings or among another shard's rows, and what reshard refuses (a shard count out of
// range, a `to` that exists); corrupt_checkpoint for a resume.bin cut short or damaged. An id
// given twice within one shard's rows is refused by that shard's start (the checkpoint "holds
// row N twice"). io_error when writing fails.
#pragma once

#include <cstdint>
#include <filesystem>

#include "actors/shard/reshard.h"

namespace psched {

struct ImportOptions {
  std::filesystem::path from;  // the export folder
  std::filesystem::path to;    // the new shards' checkpoint directory (must not exist)
  uint32_t shards = 0;         // M
  // The new deployment's split_bytes (ReshardOptions::split_bytes; 0: each dense variable split
  // or whole as the job held it).
  uint64_t split_bytes = 0;
};

struct ImportReport {
  uint64_t step = 0;  // the export's step: the job goes on from the next one
  uint64_t rows = 0;  // table rows read from the export
  ReshardReport placed;
};

// Writes the checkpoints of `options.shards` shards that start the job exported in
// `options.from` into `options.to` (the whole above). Throws Error (the refusals above);
// `options.to` is absent then.
ImportReport import_model(const ImportOptions& options);

}  // namespace psched
