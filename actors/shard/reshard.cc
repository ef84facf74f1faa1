// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/reshard.h"

#include <algorithm>
#include <memory>

#include "actors/shard/checkpoint_set.h"
#include "common/error.h"
#include "common/placement.h"
#include "common/wall_clock.h"

namespace psched {
namespace {

namespace fs = std::filesystem;

// A deployment's split_bytes when its file gives none (config/deployment.h).
constexpr uint64_t kDefaultSplitBytes = 4 << 20;

// Range `range` of a dense variable made from its old `parts`: values and optimizer state.
Variable cut(const std::vector<const SavedKind*>& parts, ElementRange range) {
  const VariableSpec& spec = parts[0]->variable->spec();
  const uint64_t bytes = element_bytes(spec.dtype);
  std::vector<std::byte> buffer(range.size() * bytes);
  auto copy = [&](const auto& read) {
    for (const SavedKind* p : parts) {
      const ElementRange part = p->variable->part();
      const ElementRange o{std::max(part.begin, range.begin), std::min(part.end, range.end)};
      if (o.begin < o.end) read(*p->variable, o, buffer.data() + (o.begin - range.begin) * bytes);
    }
  };
  copy([](const Variable& v, ElementRange o, std::byte* out) { v.read(o, out); });
  Variable made(spec, range, buffer, nullptr, nullptr);
  for (int slot = 0; slot < optim::state_slots(spec.optimizer); ++slot) {
    copy([slot](const Variable& v, ElementRange o, std::byte* out) { v.read_state(slot, o, out); });
    made.write_state(slot, range, buffer.data());
  }
  return made;
}

// One new shard's checkpoint as it is made: its kinds' records, then its rows.
struct NewShard {
  ByteWriter kinds;
  uint64_t count = 0;
  uint64_t rows_bytes = 0;
  std::unique_ptr<ShardStore> store;
  std::unique_ptr<ShardStore::CheckpointFile> file;
};

// The split_bytes that places a dense variable of `spec`, held in `parts` by `from_shards` old
// shards, as the new deployment will (ReshardOptions::split_bytes).
uint64_t split_bytes_for(const VariableSpec& spec, size_t parts, uint32_t from_shards,
                         const ReshardOptions& options) {
  if (options.split_bytes != 0) return options.split_bytes;
  if (from_shards == 1) return kDefaultSplitBytes;
  return parts > 1 ? spec.bytes() - 1 : spec.bytes();  // split again, or kept whole
}

void place_dense(const SavedKinds& kinds, const ReshardOptions& options, uint32_t from_shards,
                 const SlotMap& map, std::vector<NewShard>& out) {
  for (const std::string& name : kinds.dense_names) {
    const auto& parts = kinds.dense.at(name);
    const VariableSpec& spec = parts[0]->variable->spec();
    const uint64_t split_bytes = split_bytes_for(spec, parts.size(), from_shards, options);
    for (const ShardPart& part :
         place_variable(name, spec.elements(), element_bytes(spec.dtype), map, split_bytes)) {
      NewShard& shard = out[part.shard.value];
      shard.kinds.put(static_cast<uint8_t>(KindTag::variable));
      Variable made = cut(parts, part.range);
      made.set_last_whole_t(parts[0]->variable->last_whole_t());
      made.save_head(shard.kinds);
      shard.kinds.raw(parts[0]->track);
      made.save_sums(shard.kinds);  // between steps: no sums that count
      ++shard.count;
    }
  }
}

// Where the old rows go, by table: what pass one finds and the capacity bounds decide.
struct RowPlan {
  static constexpr uint32_t kEvicted = UINT32_MAX;
  struct Table {
    std::vector<uint64_t> rows;     // by new shard: the rows it gets
    std::vector<uint64_t> evicted;  // by new shard: rows over its max_rows, evicted
    // A table with max_rows: by old shard and slot, the row's new shard, then its new slot
    // (kEvicted: not written); and by new shard, its slots least recently updated first.
    std::vector<std::vector<uint32_t>> shard_of, slot_of;
    std::vector<std::vector<uint32_t>> order;
  };
  std::vector<Table> tables;
};

// Pass one: each new shard's rows of each table, and where a bounded table's rows go.
RowPlan count_rows(const std::vector<SavedShard>& shards, const SavedKinds& kinds,
                   const SlotMap& map, ReshardReport& report) {
  RowPlan plan;
  std::vector<uint64_t> keys;
  for (const std::string& name : kinds.table_names) {
    keys.push_back(table_key(name));
    RowPlan::Table& t = plan.tables.emplace_back();
    t.rows.resize(map.shards());
    t.evicted.resize(map.shards());
    if (kinds.tables.at(name)[0]->table->spec().max_rows != 0)
      for (const SavedKind* head : kinds.tables.at(name)) t.shard_of.emplace_back(head->rows);
  }
  for_each_row(shards, kinds,
               [&](size_t table, uint32_t old, uint32_t slot, std::span<const std::byte> row) {
                 const uint32_t shard = row_shard(keys[table], saved_row_id(row), map);
                 RowPlan::Table& t = plan.tables[table];
                 ++t.rows[shard];
                 if (!t.shard_of.empty()) t.shard_of[old][slot] = shard;
                 ++report.rows;
                 report.rows_moved += shard != old;
                 report.row_bytes += row.size();
               });
  return plan;
}

// A bounded table's rows on the new shards: the old shards' orders of last update merged (each
// row at its rank in its old shard's order, spread over [0, 1): the relative order of the rows
// of one old shard is kept; rows of different old shards interleave by rank, since the shards
// kept no common clock), the least recent beyond max_rows evicted, the rest given new slots in
// the order pass two writes them.
void plan_bounded(const std::vector<const SavedKind*>& heads, uint64_t max_rows, RowPlan::Table& t,
                  ReshardReport& report) {
  struct Entry {
    double at;
    uint32_t old, slot;
  };
  std::vector<Entry> merged;
  for (uint32_t old = 0; old < heads.size(); ++old) {
    const std::vector<uint32_t> order = heads[old]->table->capacity().order();
    for (size_t i = 0; i < order.size(); ++i)
      merged.push_back(
          {(static_cast<double>(i) + 0.5) / static_cast<double>(order.size()), old, order[i]});
  }
  std::stable_sort(merged.begin(), merged.end(),
                   [](const Entry& a, const Entry& b) { return a.at < b.at; });
  t.slot_of.resize(t.shard_of.size());
  for (uint32_t old = 0; old < t.shard_of.size(); ++old)
    t.slot_of[old].resize(t.shard_of[old].size());
  for (const Entry& e : merged) {
    const uint32_t shard = t.shard_of[e.old][e.slot];
    if (t.rows[shard] > max_rows) {
      --t.rows[shard];
      ++t.evicted[shard];
      ++report.rows_evicted;
      t.slot_of[e.old][e.slot] = RowPlan::kEvicted;
    }
  }
  std::vector<uint32_t> next(t.rows.size());
  for (uint32_t old = 0; old < t.shard_of.size(); ++old)
    for (uint32_t slot = 0; slot < t.shard_of[old].size(); ++slot)
      if (t.slot_of[old][slot] != RowPlan::kEvicted)
        t.slot_of[old][slot] = next[t.shard_of[old][slot]]++;
  t.order.resize(t.rows.size());
  for (const Entry& e : merged)
    if (t.slot_of[e.old][e.slot] != RowPlan::kEvicted)
      t.order[t.shard_of[e.old][e.slot]].push_back(t.slot_of[e.old][e.slot]);
}

// New shard `shard`'s capacity of a table: the old shards' sketches merged, its order, and the
// job's counts on new shard 0 (with the evictions the new bound made where it made them).
RowCapacity capacity_on(const std::vector<const SavedKind*>& heads, const RowPlan::Table& t,
                        uint32_t shard) {
  const TableSpec& spec = heads[0]->table->spec();
  RowCapacity capacity(spec);
  for (const SavedKind* head : heads) {
    capacity.merge_sketch(head->table->capacity());
    if (shard == 0)
      capacity.count(head->table->capacity().evictions(), head->table->capacity().dropped());
  }
  capacity.count(t.evicted[shard], 0);
  if (!t.order.empty())
    for (uint32_t slot : t.order[shard]) capacity.added(slot);
  return capacity;
}

void place_table_heads(const SavedKinds& kinds, const RowPlan& plan, std::vector<NewShard>& out) {
  for (size_t table = 0; table < kinds.table_names.size(); ++table) {
    const auto& heads = kinds.tables.at(kinds.table_names[table]);
    const RowPlan::Table& t = plan.tables[table];
    for (uint32_t shard = 0; shard < out.size(); ++shard) {
      NewShard& n = out[shard];
      n.kinds.put(static_cast<uint8_t>(KindTag::table));
      RowTable::save_head(n.kinds, heads[0]->table->spec(), t.rows[shard],
                          capacity_on(heads, t, shard));
      n.kinds.raw(heads[0]->track);
      n.kinds.raw(heads[0]->sums);
      ++n.count;
      n.rows_bytes += t.rows[shard] * heads[0]->table->record_bytes();
    }
  }
}

// Pass two: every row not evicted into its new shard's file, a chunk of rows per write.
void copy_rows(const std::vector<SavedShard>& shards, const SavedKinds& kinds, const SlotMap& map,
               const RowPlan& plan, std::vector<NewShard>& out) {
  struct Pending {
    uint64_t offset = 0;
    std::vector<std::byte> bytes;
  };
  std::vector<std::vector<Pending>> pending(kinds.table_names.size(),
                                            std::vector<Pending>(out.size()));
  std::vector<uint64_t> keys, chunk;
  for (uint32_t shard = 0; shard < out.size(); ++shard) {
    uint64_t offset = 0;
    for (size_t table = 0; table < kinds.table_names.size(); ++table) {
      pending[table][shard].offset = offset;
      offset += plan.tables[table].rows[shard] *
                kinds.tables.at(kinds.table_names[table])[0]->table->record_bytes();
    }
  }
  for (const std::string& name : kinds.table_names) {
    keys.push_back(table_key(name));
    chunk.push_back(RowTable::kRowsPerChunk * kinds.tables.at(name)[0]->table->record_bytes());
  }
  auto flush = [&out](uint32_t shard, Pending& p) {
    out[shard].file->write_rows(p.offset, p.bytes);
    p.offset += p.bytes.size();
    p.bytes.clear();
  };
  for_each_row(shards, kinds,
               [&](size_t table, uint32_t old, uint32_t slot, std::span<const std::byte> row) {
                 const RowPlan::Table& t = plan.tables[table];
                 if (!t.slot_of.empty() && t.slot_of[old][slot] == RowPlan::kEvicted) return;
                 const uint32_t shard = row_shard(keys[table], saved_row_id(row), map);
                 Pending& p = pending[table][shard];
                 p.bytes.insert(p.bytes.end(), row.begin(), row.end());
                 if (p.bytes.size() >= chunk[table]) flush(shard, p);
               });
  for (size_t table = 0; table < pending.size(); ++table)
    for (uint32_t shard = 0; shard < out.size(); ++shard)
      if (!pending[table][shard].bytes.empty()) flush(shard, pending[table][shard]);
}

void write_job(const std::vector<SavedShard>& shards, const ReshardOptions& options,
               const fs::path& staging, ReshardReport& report) {
  const SavedKinds kinds = gather_kinds(shards, "reshard");
  const std::vector<std::byte> machine = job_machine(shards, "reshard");
  std::vector<NewShard> out(options.shards);
  place_dense(kinds, options, static_cast<uint32_t>(shards.size()), report.map, out);
  RowPlan plan = count_rows(shards, kinds, report.map, report);
  for (size_t table = 0; table < kinds.table_names.size(); ++table) {
    const auto& heads = kinds.tables.at(kinds.table_names[table]);
    if (const uint64_t max_rows = heads[0]->table->spec().max_rows; max_rows != 0)
      plan_bounded(heads, max_rows, plan.tables[table], report);
  }
  place_table_heads(kinds, plan, out);
  const CheckpointHeader& old = shards[0].header;
  for (uint32_t shard = 0; shard < out.size(); ++shard) {
    ByteWriter payload;
    CheckpointHeader{ShardId(shard), old.mode, old.workers, old.job, report.map, 1, wall_clock_ns()}
        .encode(payload);
    payload.raw(machine);
    payload.put(out[shard].count);
    payload.raw(out[shard].kinds.bytes());
    out[shard].store = std::make_unique<ShardStore>(staging, ShardId(shard));
    out[shard].file = out[shard].store->open_checkpoint(1, payload.bytes(), out[shard].rows_bytes);
  }
  copy_rows(shards, kinds, report.map, plan, out);
  for (NewShard& shard : out)
    report.written.push_back(options.to / shard.file->finish().filename());
  report.variables = kinds.dense_names.size();
  report.tables = kinds.table_names.size();
}

}  // namespace

ReshardReport reshard(const ReshardOptions& options) {
  if (options.shards == 0 || options.shards > SlotMap::kSlots)
    fail(ErrorCode::bad_config, "reshard: --shards {}: a job runs on 1 to {} shards",
         options.shards, SlotMap::kSlots);
  if (fs::exists(options.to))
    fail(ErrorCode::bad_config, "reshard: {} exists; name a new directory for the new shards",
         options.to.string());
  ReshardReport report;
  write_directory(options.to, ".reshard-partial", [&](const fs::path& staging) {
    const CheckpointSetOptions set{.dirs = options.from,
                                   .tool = "reshard",
                                   .replay = options.replay,
                                   .replay_source = options.replay_source,
                                   .scratch = staging / "restored"};
    const std::vector<SavedShard> shards = read_checkpoint_set(set, report.replayed);
    report.from_shards = shards[0].header.map.shards();
    report.map = shards[0].header.map.rebalanced(options.shards);
    report.slots_moved = shards[0].header.map.moved_to(report.map);
    write_job(shards, options, staging, report);
    fs::remove_all(set.scratch);
  });
  return report;
}

}  // namespace psched
