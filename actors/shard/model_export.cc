// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/model_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/durability/npy_file.h"
#include "actors/durability/state_codec.h"
#include "actors/shard/checkpoint_set.h"
#include "common/error.h"

namespace psched {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kTool = "export";
// A table of at most this many rows has its ids written as int64, a larger one as uint64.
constexpr uint64_t kIdsAsInt64 = uint64_t{1} << 63;
// Bytes of a dense variable's optimizer state copied out at a time.
constexpr uint64_t kStateChunkBytes = 1 << 20;

// `name` as a file name: [A-Za-z0-9_.-] kept (a leading '.' not), every other byte %XX.
std::string file_name(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    const bool kept = std::isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0);
    out += kept ? std::string(1, static_cast<char>(c)) : fmt::format("%{:02X}", c);
  }
  return out;
}

// fsync of `file`, written through a stream, so that it is on disk before the folder is renamed
// into place (as the .npy files are when NpyFile::finish() returns).
void sync_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced) fail(ErrorCode::io_error, "syncing {} failed", file.string());
}

json optimizer_json(const optim::OptimizerSpec& spec) {
  json out = {{"kind", optim::to_string(spec.kind)}};
  optim::for_each_hyperparameter(
      [&](std::string_view name, auto member) { out[std::string(name)] = spec.*member; });
  return out;
}

json row_optimizer_json(const optim::RowOptimizerSpec& spec) {
  return {{"kind", optim::to_string(spec.kind)},
          {"lr", spec.lr},
          {"eps", spec.eps},
          {"beta1", spec.beta1},
          {"beta2", spec.beta2},
          {"lr_decay", spec.lr_decay},
          {"initial_accumulator_value", spec.initial_accumulator_value},
          {"weight_decay", spec.weight_decay},
          {"momentum", spec.momentum}};
}

// The folder being written: its path, and what went into it.
struct Folder {
  fs::path root;
  ExportReport& report;

  // A .npy file at `relative` (its directory made), its header written.
  std::unique_ptr<NpyFile> open(const std::string& relative, std::string_view descr,
                                std::vector<uint64_t> shape, size_t element_bytes) {
    fs::create_directories((root / relative).parent_path());
    return std::make_unique<NpyFile>(root / relative, descr, std::move(shape), element_bytes);
  }
  void finish(NpyFile& file) {
    file.finish();
    report.bytes_written += fs::file_size(file.file());
  }
};

// Dense variable `name`'s value (and, with `state`, its optimizer state slots), from its parts in
// element order; returns its manifest entry.
json export_dense(const std::vector<const SavedKind*>& parts, bool state, Folder& folder) {
  const VariableSpec& spec = parts[0]->variable->spec();
  const std::string base = "dense/" + file_name(spec.name);
  const size_t bytes = element_bytes(spec.dtype);
  json entry = {{"name", spec.name},
                {"file", base + ".npy"},
                {"shape", spec.shape},
                {"dtype", to_string(spec.dtype)},
                {"step", parts[0]->step.value},
                {"optimizer", optimizer_json(spec.optimizer)},
                {"state", json::array()}};
  auto value = folder.open(base + ".npy", npy_descr(spec.dtype), spec.shape, bytes);
  for (const SavedKind* p : parts) value->write(p->variable->view(p->variable->part()));
  folder.finish(*value);
  for (int slot = 0; state && slot < optim::state_slots(spec.optimizer); ++slot) {
    const std::string file = fmt::format("dense_state/{}.{}.npy", file_name(spec.name), slot);
    auto out = folder.open(file, npy_descr(spec.dtype), spec.shape, bytes);
    std::vector<std::byte> buffer(std::min<uint64_t>(kStateChunkBytes, spec.bytes()));
    for (const SavedKind* p : parts)
      for (uint64_t at = p->variable->part().begin; at < p->variable->part().end;) {
        const ElementRange piece{at, std::min(p->variable->part().end, at + buffer.size() / bytes)};
        p->variable->read_state(slot, piece, buffer.data());
        out->write(std::span(buffer).first(piece.size() * bytes));
        at = piece.end;
      }
    folder.finish(*out);
    entry["state"].push_back(file);
  }
  return entry;
}

// One table's files as its rows stream in: a chunk of rows gathered, then written.
struct TableOut {
  uint64_t row_bytes = 0, state_bytes = 0;
  std::unique_ptr<NpyFile> ids, values, state;
  std::vector<std::byte> id_chunk, value_chunk, state_chunk;
  uint64_t held = 0;  // rows in the chunks

  void add(std::span<const std::byte> record) {
    id_chunk.insert(id_chunk.end(), record.begin(), record.begin() + sizeof(uint64_t));
    const auto value = record.subspan(sizeof(uint64_t), row_bytes);
    value_chunk.insert(value_chunk.end(), value.begin(), value.end());
    if (state) {
      const auto s = record.subspan(sizeof(uint64_t) + row_bytes, state_bytes);
      state_chunk.insert(state_chunk.end(), s.begin(), s.end());
    }
    if (++held == RowTable::kRowsPerChunk) flush();
  }
  void flush() {
    ids->write(id_chunk);
    values->write(value_chunk);
    if (state) state->write(state_chunk);
    id_chunk.clear();
    value_chunk.clear();
    state_chunk.clear();
    held = 0;
  }
};

// A table's files opened (headers written, `rows` rows to come) and its manifest entry.
json open_table(const std::vector<const SavedKind*>& heads, bool state, Folder& folder,
                TableOut& out) {
  const TableSpec& spec = heads[0]->table->spec();
  uint64_t rows = 0;
  for (const SavedKind* head : heads) rows += head->rows;
  const size_t bytes = element_bytes(spec.dtype);
  const uint64_t state_elements = optim::row_state_elements(spec.optimizer, spec.dim);
  const std::string base = "tables/" + file_name(spec.name) + "/";
  out.row_bytes = spec.row_bytes();
  out.state_bytes = state_elements * bytes;
  // int64, what torch.from_numpy takes (no uint64 tensors), wherever every id fits.
  const bool signed_ids = spec.num_embeddings <= kIdsAsInt64;
  out.ids = folder.open(base + "ids.npy", signed_ids ? "<i8" : "<u8", {rows}, sizeof(uint64_t));
  out.values = folder.open(base + "values.npy", npy_descr(spec.dtype), {rows, spec.dim}, bytes);
  if (state)
    out.state =
        folder.open(base + "state.npy", npy_descr(spec.dtype), {rows, state_elements}, bytes);
  return {{"name", spec.name},
          {"num_embeddings", spec.num_embeddings},
          {"dim", spec.dim},
          {"dtype", to_string(spec.dtype)},
          {"rows", rows},
          {"init", {{"kind", to_string(spec.init.kind)}, {"a", spec.init.a}, {"b", spec.init.b}}},
          {"seed", spec.seed},
          {"max_rows", spec.max_rows},
          {"admit_after", spec.admit_after},
          {"step", heads[0]->step.value},
          {"optimizer", row_optimizer_json(spec.optimizer)},
          {"ids", base + "ids.npy"},
          {"ids_dtype", signed_ids ? "int64" : "uint64"},
          {"values", base + "values.npy"},
          {"state", state ? json(base + "state.npy") : json(nullptr)},
          {"state_elements", state_elements}};
}

// Every table's rows, streamed from the checkpoints into their files.
json export_tables(const std::vector<SavedShard>& shards, const SavedKinds& kinds, bool state,
                   Folder& folder) {
  json entries = json::array();
  std::vector<TableOut> out(kinds.table_names.size());
  for (size_t t = 0; t < out.size(); ++t)
    entries.push_back(open_table(kinds.tables.at(kinds.table_names[t]), state, folder, out[t]));
  size_t current = 0;  // the table whose rows stream now: another's chunk is written first
  for_each_row(shards, kinds,
               [&](size_t table, uint32_t, uint32_t, std::span<const std::byte> record) {
                 if (table != current && out[current].held > 0) out[current].flush();
                 current = table;
                 out[table].add(record);
                 ++folder.report.rows;
               });
  for (TableOut& t : out) {
    if (t.held > 0) t.flush();
    for (NpyFile* file : {t.ids.get(), t.values.get(), t.state.get()})
      if (file) folder.finish(*file);
  }
  return entries;
}

// resume.bin (model_import.h has the layout): what `psched import` makes the job's shards of
// again besides the arrays.
void write_resume(const std::vector<SavedShard>& shards, const SavedKinds& kinds, Folder& folder) {
  ByteWriter out;
  out.text(kResumeMagic);
  out.put<uint32_t>(kResumeVersion);
  shards[0].header.encode(out);
  out.blob(job_machine(shards, kTool));
  std::map<const SavedKind*, uint32_t> shard_of;
  for (uint32_t s = 0; s < shards.size(); ++s)
    for (const SavedKind& kind : shards[s].kinds) shard_of[&kind] = s;
  out.put<uint64_t>(kinds.dense_names.size());
  for (const std::string& name : kinds.dense_names) {
    const auto& parts = kinds.dense.at(name);
    encode(out, parts[0]->variable->spec());
    out.put<uint32_t>(static_cast<uint32_t>(parts.size()));
    for (const SavedKind* p : parts) {
      out.put<uint32_t>(shard_of.at(p));
      encode(out, p->variable->part());
      out.blob(p->track);
      out.blob(p->sums);
    }
  }
  out.put<uint64_t>(kinds.table_names.size());
  for (const std::string& name : kinds.table_names)
    for (const SavedKind* head : kinds.tables.at(name)) {  // shard 0's first
      ByteWriter saved;
      RowTable::save_head(saved, head->table->spec(), head->rows, head->table->capacity());
      out.blob(saved.bytes());
      out.blob(head->track);
      out.blob(head->sums);
    }
  const fs::path file = folder.root / kResumeFile;
  {
    std::ofstream stream(file, std::ios::binary);
    stream.write(reinterpret_cast<const char*>(out.bytes().data()),
                 static_cast<std::streamsize>(out.bytes().size()));
    if (!stream.flush()) fail(ErrorCode::io_error, "writing {} failed", file.string());
  }
  sync_file(file);
  folder.report.bytes_written += out.bytes().size();
}

// The manifest's job, placement and sources: each shard's checkpoint file, the one it was
// restored from for a shard whose logs were replayed (its fresh checkpoint was a scratch file).
json manifest_head(const std::vector<SavedShard>& shards, const std::vector<ShardReplay>& replayed,
                   bool state) {
  const CheckpointHeader& h = shards[0].header;
  json files = json::array();
  for (const SavedShard& s : shards) files.push_back(s.checkpoint.file.string());
  json replays = json::array();
  for (const ShardReplay& r : replayed) {
    files[r.shard] = r.checkpoint.string();
    replays.push_back({{"shard", r.shard}, {"updates", r.updates}, {"lost", r.lost}});
  }
  return {{"format", "psched-export"},
          {"version", kExportVersion},
          {"checkpoint_format", ShardStore::kCheckpointFormat},
          {"job", fmt::format("{:016x}", h.job)},
          {"mode", to_string(h.mode)},
          {"workers", h.workers},
          {"slot_map", {{"epoch", h.map.epoch()}, {"shards", h.map.shards()}}},
          {"checkpoints", files},
          {"replayed", replays},
          {"optimizer_state", state},
          {"row_order", "storage"}};
}

void write_manifest(const json& manifest, Folder& folder) {
  const fs::path file = folder.root / "manifest.json";
  const std::string text = manifest.dump(1) + "\n";
  {
    std::ofstream out(file, std::ios::binary);
    out << text;
    if (!out.flush()) fail(ErrorCode::io_error, "writing {} failed", file.string());
  }
  sync_file(file);
  folder.report.bytes_written += text.size();
}

// fsync of `dir`, so that a rename in it lasts.
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_folder(const std::vector<SavedShard>& shards, const ExportOptions& options,
                  Folder& folder) {
  const SavedKinds kinds = gather_kinds(shards, kTool);
  json manifest = manifest_head(shards, folder.report.replayed, options.with_optimizer_state);
  uint64_t step = 0;
  json dense = json::array();
  for (const std::string& name : kinds.dense_names) {
    dense.push_back(export_dense(kinds.dense.at(name), options.with_optimizer_state, folder));
    step = std::max(step, kinds.dense.at(name)[0]->step.value);
  }
  for (const std::string& name : kinds.table_names)
    step = std::max(step, kinds.tables.at(name)[0]->step.value);
  manifest["step"] = step;
  manifest["dense"] = std::move(dense);
  manifest["tables"] = export_tables(shards, kinds, options.with_optimizer_state, folder);
  if (options.with_optimizer_state) {
    write_resume(shards, kinds, folder);
    manifest["resume"] = kResumeFile;
  }
  write_manifest(manifest, folder);
  sync_directory(folder.root);
  folder.report.step = step;
  folder.report.variables = kinds.dense_names.size();
  folder.report.tables = kinds.table_names.size();
}

}  // namespace

ExportReport export_model(const ExportOptions& options) {
  if (fs::exists(options.to))
    fail(ErrorCode::bad_config, "export: {} exists; name a new folder for the export",
         options.to.string());
  ExportReport report;
  write_directory(options.to, ".partial", [&](const fs::path& staging) {
    const CheckpointSetOptions set{.dirs = options.from,
                                   .tool = kTool,
                                   .replay = options.replay,
                                   .replay_source = options.replay_source,
                                   .scratch = staging / "restored"};
    const std::vector<SavedShard> shards = read_checkpoint_set(set, report.replayed);
    report.shards = shards[0].header.map.shards();
    fs::create_directories(staging);
    Folder folder{staging, report};
    write_folder(shards, options, folder);
    fs::remove_all(set.scratch);
  });
  sync_directory(fs::absolute(options.to).parent_path());
  return report;
}

}  // namespace psched
