// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/model_import.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/durability/file_io.h"
#include "actors/durability/npy_file.h"
#include "actors/durability/shard_durability.h"
#include "actors/durability/shard_store.h"
#include "actors/durability/state_codec.h"
#include "actors/shard/checkpoint_set.h"
#include "actors/shard/hosted_kind.h"
#include "actors/shard/model_export.h"
#include "actors/shard/row_table.h"
#include "actors/shard/variable.h"
#include "common/error.h"
#include "common/wall_clock.h"
#include "optim/row_optimizer.h"

namespace psched {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Bytes = std::vector<std::byte>;

Bytes copy_of(std::span<const std::byte> bytes) {
  return {bytes.begin(), bytes.end()};
}

// resume.bin, decoded (model_import.h has the layout).
struct Resume {
  struct Part {
    uint32_t shard = 0;
    ElementRange range;
    Bytes track, sums;
  };
  struct Dense {
    VariableSpec spec;
    std::vector<Part> parts;
  };
  struct Head {  // one shard's of a table
    TableSpec spec;
    uint64_t rows = 0;
    Bytes head, track, sums;
  };
  CheckpointHeader header;
  Bytes machine;
  std::vector<Dense> dense;
  std::vector<std::vector<Head>> tables;  // by table, then shard
};

Resume::Dense read_dense(ByteReader& in, uint32_t shards) {
  Resume::Dense d{.spec = decode_spec(in)};
  const auto parts = in.get<uint32_t>();
  for (uint32_t k = 0; k < parts; ++k) {
    Resume::Part& p = d.parts.emplace_back();
    p.shard = in.get<uint32_t>();
    p.range = decode_range(in);
    p.track = copy_of(in.blob());
    p.sums = copy_of(in.blob());
    if (p.shard >= shards || p.range.end > d.spec.elements() || p.range.begin >= p.range.end)
      fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has part [{}, {}) on shard {}",
           in.what(), d.spec.name, p.range.begin, p.range.end, p.shard);
  }
  return d;
}

Resume read_resume(const fs::path& file) {
  if (!fs::exists(file))
    fail(ErrorCode::bad_config, "import: {} is missing: the export is not whole", file.string());
  const Bytes bytes = read_file(file);
  ByteReader in(bytes, file.string());
  if (bytes.size() < sizeof(uint64_t) + kResumeMagic.size() || in.text() != kResumeMagic)
    fail(ErrorCode::corrupt_checkpoint, "{}: not a psched resume file", file.string());
  if (const auto version = in.get<uint32_t>(); version != kResumeVersion)
    fail(ErrorCode::bad_config, "import: {} is version {}; this psched reads version {}",
         file.string(), version, kResumeVersion);
  Resume r{.header = CheckpointHeader::decode(in), .machine = copy_of(in.blob())};
  const uint32_t shards = r.header.map.shards();
  for (uint64_t n = in.get<uint64_t>(); n > 0; --n) r.dense.push_back(read_dense(in, shards));
  for (uint64_t n = in.get<uint64_t>(); n > 0; --n) {
    auto& heads = r.tables.emplace_back();
    for (uint32_t s = 0; s < shards; ++s) {
      Resume::Head& h = heads.emplace_back();
      h.head = copy_of(in.blob());
      ByteReader head(h.head, file.string());
      h.spec = decode_table_spec(head);
      h.rows = head.get<uint64_t>();
      h.track = copy_of(in.blob());
      h.sums = copy_of(in.blob());
    }
  }
  if (!in.done())
    fail(ErrorCode::corrupt_checkpoint, "{}: {} bytes after its last table", file.string(),
         bytes.size() - in.position());
  return r;
}

json read_manifest(const fs::path& folder) {
  const fs::path file = folder / "manifest.json";
  std::ifstream in(file);
  if (!in)
    fail(ErrorCode::bad_config,
         "import: {} has no manifest.json: name a folder psched export wrote", folder.string());
  json m = json::parse(in, nullptr, false);
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != "psched-export")
    fail(ErrorCode::bad_config, "import: {} is no psched-export manifest", file.string());
  if (m.value("version", 0u) != kExportVersion)
    fail(ErrorCode::bad_config, "import: {} is version {}; this psched reads version {}",
         file.string(), m.at("version").dump(), kExportVersion);
  if (!m.value("optimizer_state", false) || !m.contains("resume"))
    fail(ErrorCode::bad_config,
         "import: {} was exported without its optimizer state, and with it the step records "
         "and placement a job resumes from: export the job again with --with-optimizer-state "
         "(psched.torch.export(..., with_optimizer_state=True))",
         folder.string());
  return m;
}

// `what`'s manifest entry `entry` against resume.bin's spec: the same name, shape and dtype.
void check_entry(const json& entry, const std::string& name, const std::vector<uint64_t>& shape,
                 DType dtype, const fs::path& folder) {
  if (entry.value("name", "") != name || entry.value("dtype", "") != to_string(dtype) ||
      (!shape.empty() && entry.at("shape") != json(shape)))
    fail(ErrorCode::bad_config,
         "import: {}: the manifest's entry {} is not resume.bin's '{}' ({} of shape ({})): the "
         "two are of different models",
         folder.string(), entry.dump(), name, to_string(dtype), fmt::join(shape, ", "));
}

// The manifest's and resume.bin's models: the same variables and tables in the same order.
void check_model(const json& m, const Resume& r, const fs::path& folder) {
  if (m.at("dense").size() != r.dense.size() || m.at("tables").size() != r.tables.size())
    fail(ErrorCode::bad_config,
         "import: {}: the manifest lists {} dense variable(s) and {} table(s), resume.bin {} and "
         "{}: the two are of different models",
         folder.string(), m.at("dense").size(), m.at("tables").size(), r.dense.size(),
         r.tables.size());
  for (size_t d = 0; d < r.dense.size(); ++d)
    check_entry(m.at("dense").at(d), r.dense[d].spec.name, r.dense[d].spec.shape,
                r.dense[d].spec.dtype, folder);
  for (size_t t = 0; t < r.tables.size(); ++t) {
    const TableSpec& spec = r.tables[t][0].spec;
    uint64_t rows = 0;
    for (const Resume::Head& h : r.tables[t]) rows += h.rows;
    check_entry(m.at("tables").at(t), spec.name, {}, spec.dtype, folder);
    if (m.at("tables").at(t).value("rows", uint64_t{0}) != rows ||
        m.at("tables").at(t).value("dim", 0u) != spec.dim)
      fail(ErrorCode::bad_config,
           "import: {}: table '{}' has {} rows of dim {} in resume.bin, the manifest says {}",
           folder.string(), spec.name, rows, spec.dim, m.at("tables").at(t).dump());
  }
}

// A .npy file of the export named by the manifest's `relative` path, checked to hold `what`.
std::unique_ptr<NpyReader> open_array(const fs::path& folder, const json& relative,
                                      std::string_view what,
                                      std::initializer_list<std::string_view> descrs,
                                      const std::vector<uint64_t>& shape) {
  if (!relative.is_string())
    fail(ErrorCode::bad_config, "import: {}: the manifest names no file for {}", folder.string(),
         what);
  const fs::path file = folder / relative.get<std::string>();
  if (!fs::exists(file))
    fail(ErrorCode::bad_config, "import: {} ({}) is missing: the export is not whole",
         file.string(), what);
  auto array = std::make_unique<NpyReader>(file);
  array->expect(what, descrs, shape);
  return array;
}

// Dense variable `d`'s parts, each a Variable holding its values and optimizer state from the
// export's arrays, in resume.bin's order.
std::vector<Variable> dense_parts(const Resume::Dense& d, const json& entry,
                                  const fs::path& folder) {
  const VariableSpec& spec = d.spec;
  const size_t bytes = element_bytes(spec.dtype);
  auto whole = [&](const json& file, const std::string& what) {
    Bytes out(spec.bytes());
    open_array(folder, file, what, {npy_descr(spec.dtype)}, spec.shape)->read(out);
    return out;
  };
  const Bytes value = whole(entry.at("file"), fmt::format("variable '{}'", spec.name));
  const int slots = optim::state_slots(spec.optimizer);
  if (!entry.at("state").is_array() || entry.at("state").size() != static_cast<size_t>(slots))
    fail(ErrorCode::bad_config,
         "import: {}: variable '{}' has {} optimizer state file(s), its "
         "optimizer {}",
         folder.string(), spec.name, entry.at("state").size(), slots);
  std::vector<Variable> parts;
  for (const Resume::Part& p : d.parts)
    parts.emplace_back(spec, p.range,
                       std::span(value).subspan(p.range.begin * bytes, p.range.size() * bytes),
                       nullptr, nullptr);
  for (int slot = 0; slot < slots; ++slot) {
    const Bytes state =
        whole(entry.at("state").at(slot), fmt::format("variable '{}' state {}", spec.name, slot));
    for (size_t k = 0; k < parts.size(); ++k)
      parts[k].write_state(slot, d.parts[k].range, state.data() + d.parts[k].range.begin * bytes);
  }
  return parts;
}

// One table's arrays, read a shard's rows at a time.
struct TableArrays {
  const TableSpec* spec = nullptr;
  uint64_t row_bytes = 0, state_bytes = 0;
  std::unique_ptr<NpyReader> ids, values, state;

  // The next `rows` rows, shard `shard`'s of the job placed by `map`, as records (id, value,
  // state) into `file` from `offset`; returns the offset after them.
  uint64_t copy(uint64_t rows, uint32_t shard, const SlotMap& map, ShardStore::CheckpointFile& file,
                uint64_t offset) {
    const uint64_t record = sizeof(uint64_t) + row_bytes + state_bytes;
    Bytes id_chunk, value_chunk, state_chunk, records;
    for (uint64_t done = 0; done < rows;) {
      const uint64_t n = std::min<uint64_t>(rows - done, RowTable::kRowsPerChunk);
      id_chunk.resize(n * sizeof(uint64_t));
      value_chunk.resize(n * row_bytes);
      state_chunk.resize(n * state_bytes);
      ids->read(id_chunk);
      values->read(value_chunk);
      state->read(state_chunk);
      records.resize(n * record);
      for (uint64_t k = 0; k < n; ++k) {
        std::byte* out = records.data() + k * record;
        std::memcpy(out, id_chunk.data() + k * sizeof(uint64_t), sizeof(uint64_t));
        check_id(saved_row_id(std::span(out, sizeof(uint64_t))), shard, map);
        std::memcpy(out + sizeof(uint64_t), value_chunk.data() + k * row_bytes, row_bytes);
        std::memcpy(out + sizeof(uint64_t) + row_bytes, state_chunk.data() + k * state_bytes,
                    state_bytes);
      }
      file.write_rows(offset, records);
      offset += records.size();
      done += n;
    }
    return offset;
  }
  // An id past the table, or one not of the shard whose rows these are (the arrays' rows
  // reordered, an id changed: a row, or its place in a bounded table's eviction order, would
  // land on the wrong shard).
  void check_id(uint64_t id, uint32_t shard, const SlotMap& map) const {
    if (id >= spec->num_embeddings)
      fail(ErrorCode::bad_config, "import: {}: id {} of table '{}', which has {} rows",
           ids->file().string(), id, spec->name, spec->num_embeddings);
    if (const uint32_t owner = row_shard(table_key(spec->name), id, map); owner != shard)
      fail(ErrorCode::bad_config,
           "import: {}: id {} is among shard {}'s rows of table '{}', but the job's slot map "
           "gives it to shard {}: the rows were reordered or an id changed (values may change "
           "in numpy; ids and their order may not)",
           ids->file().string(), id, shard, spec->name, owner);
  }
};

TableArrays table_arrays(const std::vector<Resume::Head>& heads, const json& entry,
                         const fs::path& folder) {
  const TableSpec& spec = heads[0].spec;
  uint64_t rows = 0;
  for (const Resume::Head& h : heads) rows += h.rows;
  const uint64_t state_elements = optim::row_state_elements(spec.optimizer, spec.dim);
  const std::string what = fmt::format("table '{}'", spec.name);
  TableArrays t{.spec = &spec,
                .row_bytes = spec.row_bytes(),
                .state_bytes = state_elements * element_bytes(spec.dtype)};
  t.ids = open_array(folder, entry.at("ids"), what + " ids", {"<i8", "<u8"}, {rows});
  t.values = open_array(folder, entry.at("values"), what + " values", {npy_descr(spec.dtype)},
                        {rows, spec.dim});
  t.state = open_array(folder, entry.at("state"), what + " state", {npy_descr(spec.dtype)},
                       {rows, state_elements});
  return t;
}

// The job's shard `shard` again, into `dir`: its dense parts, its tables' heads and rows.
fs::path write_shard(uint32_t shard, const Resume& r,
                     const std::vector<std::vector<Variable>>& parts,
                     std::vector<TableArrays>& tables, const fs::path& dir) {
  ByteWriter kinds;
  uint64_t count = 0, rows_bytes = 0;
  for (size_t d = 0; d < r.dense.size(); ++d)
    for (size_t k = 0; k < r.dense[d].parts.size(); ++k) {
      const Resume::Part& p = r.dense[d].parts[k];
      if (p.shard != shard) continue;
      kinds.put(static_cast<uint8_t>(KindTag::variable));
      parts[d][k].save_head(kinds);
      kinds.raw(p.track);
      kinds.raw(p.sums);
      ++count;
    }
  for (size_t t = 0; t < r.tables.size(); ++t) {
    const Resume::Head& h = r.tables[t][shard];
    kinds.put(static_cast<uint8_t>(KindTag::table));
    kinds.raw(h.head);
    kinds.raw(h.track);
    kinds.raw(h.sums);
    ++count;
    rows_bytes += h.rows * (sizeof(uint64_t) + tables[t].row_bytes + tables[t].state_bytes);
  }
  CheckpointHeader header = r.header;
  header.shard = ShardId(shard);
  header.generation = 1;
  header.written_at_ns = wall_clock_ns();
  ByteWriter payload;
  header.encode(payload);
  payload.raw(r.machine);
  payload.put(count);
  payload.raw(kinds.bytes());
  ShardStore store(dir, ShardId(shard));
  auto file = store.open_checkpoint(1, payload.bytes(), rows_bytes);
  uint64_t offset = 0;
  for (size_t t = 0; t < r.tables.size(); ++t)
    offset = tables[t].copy(r.tables[t][shard].rows, shard, r.header.map, *file, offset);
  return file->finish();
}

// The job's N shards' checkpoints again, into `dir`; returns the rows copied.
uint64_t write_job(const fs::path& folder, const json& m, const Resume& r, const fs::path& dir) {
  std::vector<std::vector<Variable>> parts;
  for (size_t d = 0; d < r.dense.size(); ++d)
    parts.push_back(dense_parts(r.dense[d], m.at("dense").at(d), folder));
  std::vector<TableArrays> tables;
  uint64_t rows = 0;
  for (size_t t = 0; t < r.tables.size(); ++t) {
    tables.push_back(table_arrays(r.tables[t], m.at("tables").at(t), folder));
    for (const Resume::Head& h : r.tables[t]) rows += h.rows;
  }
  fs::create_directories(dir);
  for (uint32_t shard = 0; shard < r.header.map.shards(); ++shard)
    write_shard(shard, r, parts, tables, dir);
  return rows;
}

// What `read` returns; a json exception in it (a manifest whose entries are not what psched
// export writes) thrown as Error(bad_config) naming the manifest.
template <typename Read>
auto from_manifest(const fs::path& folder, const Read& read) {
  try {
    return read();
  } catch (const json::exception& e) {
    fail(ErrorCode::bad_config,
         "import: {}: the manifest does not read as psched export writes it: {}",
         (folder / "manifest.json").string(), e.what());
  }
}

}  // namespace

ImportReport import_model(const ImportOptions& options) {
  if (options.shards == 0 || options.shards > SlotMap::kSlots)
    fail(ErrorCode::bad_config, "import: --shards {}: a job runs on 1 to {} shards", options.shards,
         SlotMap::kSlots);
  if (fs::exists(options.to))
    fail(ErrorCode::bad_config, "import: {} exists; name a new directory for the new shards",
         options.to.string());
  const fs::path& from = options.from;
  // "new/" names "new": the staging directory goes beside it, not inside.
  const fs::path to = options.to.has_filename() ? options.to : options.to.parent_path();
  const json m = from_manifest(from, [&] { return read_manifest(from); });
  const Resume r = from_manifest(from, [&] {
    Resume read = read_resume(from / m.at("resume").get<std::string>());
    check_model(m, read, from);
    return read;
  });
  ImportReport report{.step = from_manifest(from, [&] { return m.value("step", uint64_t{0}); })};
  fs::path staging = to;
  staging += ".import-partial";
  std::error_code ignored;           // a failure to clean up must not hide what happened
  fs::remove_all(staging, ignored);  // an interrupted import's
  try {
    report.rows = from_manifest(from, [&] { return write_job(from, m, r, staging / "job"); });
    report.placed = reshard({.from = {staging / "job"},
                             .to = to,
                             .shards = options.shards,
                             .split_bytes = options.split_bytes});
  } catch (...) {
    fs::remove_all(staging, ignored);
    throw;
  }
  fs::remove_all(staging, ignored);
  return report;
}

}  // namespace psched
