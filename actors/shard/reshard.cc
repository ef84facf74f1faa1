// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/reshard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <kj/async.h>

#include "actors/durability/file_io.h"
#include "actors/durability/shard_durability.h"
#include "actors/durability/shard_store.h"
#include "actors/durability/update_log.h"
#include "actors/runtime/actor.h"
#include "actors/shard/row_table.h"
#include "actors/shard/step_machine.h"
#include "actors/shard/variable.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"
#include "common/placement.h"
#include "common/result.h"
#include "common/wall_clock.h"

namespace psched {
namespace {

namespace fs = std::filesystem;

// A deployment's split_bytes when its file gives none (config/deployment.h).
constexpr uint64_t kDefaultSplitBytes = 4 << 20;

// One kind an old shard hosted, read from its checkpoint: a dense variable's part whole, a
// table's head (its rows stay in the file), and the records of its steps and sums as saved.
struct OldKind {
  std::unique_ptr<Variable> variable;
  std::unique_ptr<RowTable> table;
  uint64_t rows = 0;     // a table's rows in its shard's stream
  uint64_t rows_at = 0;  // where they start in that stream
  std::vector<std::byte> track, sums;
  bool between_steps = true;  // its track's: no step part-way

  const std::string& name() const { return variable ? variable->name() : table->name(); }
};

struct OldShard {
  ShardStore::Checkpoint checkpoint;
  // What messages call it: its checkpoint's file, or for one restored from its logs (whose
  // file is a scratch one), the old checkpoint and logs it was restored from.
  std::string name;
  CheckpointHeader header;
  std::vector<std::byte> machine;  // StepMachine::save's record
  std::vector<std::byte> members;  // its membership's, the record's first bytes
  std::vector<OldKind> kinds;
};

std::vector<std::byte> slice(std::span<const std::byte> bytes, uint64_t from, uint64_t to) {
  return {bytes.begin() + static_cast<ptrdiff_t>(from), bytes.begin() + static_cast<ptrdiff_t>(to)};
}

// Why checkpoint `found` of `store`'s shard does not hold everything the shard acknowledged,
// as a start of its server would find (ShardStore::replay): a newer checkpoint that is corrupt
// (`skipped`), updates logged after it, a log damaged or missing. Empty when it holds it all (a
// clean stop: its log follows it empty, or with only a torn record never acknowledged).
std::string unreplayed(const ShardStore& store, const ShardStore::Checkpoint& found,
                       const std::vector<std::string>& skipped) {
  if (!skipped.empty())
    return fmt::format("{}; a start of its server falls back to {} and the logs after it",
                       skipped.front(), found.file.string());
  for (uint64_t g = found.generation; g <= store.newest_generation(); ++g) {
    const fs::path log = store.log_file(g);
    if (!fs::exists(log)) {
      if (g > found.generation || found.log_follows)
        return fmt::format("{} is missing, and checkpoint {} is followed by a log", log.string(),
                           found.file.string());
      continue;
    }
    const LogScan scan = scan_log(log, g, nullptr);
    if (scan.records > 0)
      return fmt::format("{} holds {} update(s) logged after checkpoint {}", log.string(),
                         scan.records, found.file.string());
    if (!scan.problem.empty() && !scan.torn_tail)
      return fmt::format("{}: {} at byte {}", log.string(), scan.problem, scan.bad_at);
  }
  return {};
}

// Throws unless `settings` (ReshardOptions::replay) are of the job whose checkpoint `file`
// begins with `header`: its mode, workers and shard count.
void check_replay_settings(const ShardSettings& settings, const std::string& source,
                           const CheckpointHeader& header, const fs::path& file) {
  if (settings.mode == header.mode && settings.workers == header.workers &&
      settings.shards == header.map.shards())
    return;
  fail(ErrorCode::bad_config,
       "reshard: {} runs {} mode with {} workers on {} shards, and {} holds shard {} of a job in "
       "{} mode with {} workers on {} shards: give the deployment file the job's servers ran "
       "with",
       source, to_string(settings.mode), settings.workers, settings.shards, file.string(),
       header.shard.value, to_string(header.mode), header.workers, header.map.shards());
}

// `text` with the paths of the files in `scratch` named as the files of `dir` they copy.
std::string as_original(std::string text, const fs::path& scratch, const fs::path& dir) {
  const std::string from = scratch.string() + "/", to = dir.string() + "/";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// Shard `id`'s files of `dir` in `scratch` (made here): links to its checkpoints, or copies
// where no link can be made, and copies of its logs (a restore cuts a torn record off the newest
// log, and `dir` is not to change).
void copy_shard_files(const fs::path& dir, ShardId id, const fs::path& scratch) {
  const std::string prefix = fmt::format("shard-{}.", id.value);
  try {
    fs::create_directories(scratch);
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(prefix)) continue;
      std::error_code not_linked;
      if (name.ends_with(".ckpt")) fs::create_hard_link(entry.path(), scratch / name, not_linked);
      if ((name.ends_with(".ckpt") && not_linked) || name.ends_with(".log"))
        fs::copy_file(entry.path(), scratch / name);
    }
  } catch (const fs::filesystem_error& e) {
    fail(ErrorCode::io_error, "reshard: cannot copy shard {}'s files from {} into {}: {}", id.value,
         dir.string(), scratch.string(), e.what());
  }
}

// A VariableShard of `settings` restored (VariableShard::restore, what its server's start
// does), on a loop of a thread of its own (the caller's may run one). Rethrows its failure.
RestoreReport restore_on_a_loop(const ShardSettings& settings) {
  std::exception_ptr error;
  RestoreReport restored;
  std::thread([&] {
    try {
      kj::EventLoop events;
      kj::WaitScope scope(events);
      ActorLoop loop;
      VariableShard shard(loop, settings);
      shard.restore([&](std::exception_ptr e, RestoreReport r) {
        error = e;
        restored = std::move(r);
      });
      scope.poll();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return restored;
}

// Shard `id` of `dir` restored as its server's start restores it, under `settings`, from its
// files copied into `scratch` (copy_shard_files). Returns the fresh checkpoint the restore
// wrote there, and says in `replay` what it replayed. Throws what the restore throws (a damaged
// log: Error(corrupt_checkpoint) naming the file of `dir` and the byte).
ShardStore::Checkpoint restore_shard(const fs::path& dir, ShardId id, ShardSettings settings,
                                     const fs::path& scratch, ReshardReplay& replay) {
  copy_shard_files(dir, id, scratch);
  settings.id = id;
  settings.checkpoint_directory = scratch;
  RestoreReport restored;
  try {
    restored = restore_on_a_loop(settings);
  } catch (...) {
    const Error e = caught();
    fail(e.code(), "reshard: {}", as_original(e.what(), scratch, dir));
  }
  replay.shard = id.value;
  replay.checkpoint = dir / restored.checkpoint.filename();
  replay.updates = restored.replayed;
  for (const std::string& dropped : restored.skipped)
    replay.dropped.push_back("in a copy: " + as_original(dropped, scratch, dir));
  replay.lost = as_original(restored.lost, scratch, dir);
  std::vector<std::string> skipped;
  std::optional<ShardStore::Checkpoint> fresh = ShardStore(scratch, id).load_latest(skipped);
  if (!fresh || fresh->file != restored.written)
    fail(ErrorCode::internal, "reshard: shard {}'s restored checkpoint {} does not read back",
         id.value, restored.written.string());
  return std::move(*fresh);
}

// The kind whose record starts at `in` (VariableShard::save_variables' layout), `payload` the
// bytes `in` reads.
OldKind read_kind(ByteReader& in, std::span<const std::byte> payload,
                  const CheckpointHeader& header, uint64_t& rows_at) {
  OldKind kind;
  const auto tag = in.get<uint8_t>();
  if (tag == static_cast<uint8_t>(KindTag::variable)) {
    kind.variable = std::make_unique<Variable>(Variable::restore(in));
  } else if (tag == static_cast<uint8_t>(KindTag::table)) {
    kind.table = std::make_unique<RowTable>(RowTable::restore_head(in, kind.rows));
    kind.rows_at = rows_at;
    rows_at += kind.rows * kind.table->record_bytes();
  } else {
    fail(ErrorCode::corrupt_checkpoint, "{}: unknown kind {} of variable", in.what(), tag);
  }
  HostedKind& hosted = kind.variable ? static_cast<HostedKind&>(*kind.variable) : *kind.table;
  const uint64_t track_at = in.position();
  StepTrack track(hosted.name(), hosted.extent(), header.mode, header.workers, nullptr);
  track.load(in);
  kind.between_steps = track.between_steps();
  kind.track = slice(payload, track_at, in.position());
  const uint64_t sums_at = in.position();
  hosted.load_sums(in);
  kind.sums = slice(payload, sums_at, in.position());
  return kind;
}

// Shard `id`'s newest valid checkpoint in `dir`, and in `why` what it does not hold
// (unreplayed); throws when there is none.
ShardStore::Checkpoint newest_checkpoint(const fs::path& dir, ShardId id, std::string& why) {
  ShardStore store(dir, id);
  std::vector<std::string> skipped;
  std::optional<ShardStore::Checkpoint> found = store.load_latest(skipped);
  if (!found)
    fail(ErrorCode::bad_config, "reshard: shard {} has no valid checkpoint in {}{}", id.value,
         dir.string(), skipped.empty() ? "" : ": " + skipped.front());
  why = unreplayed(store, *found, skipped);
  return std::move(*found);
}

// The shard whose checkpoint is `checkpoint`, read and checked; `name` names it in messages.
OldShard parse_shard(ShardStore::Checkpoint checkpoint, std::string name, ShardId id) {
  OldShard old{.checkpoint = std::move(checkpoint), .name = std::move(name)};
  const std::span<const std::byte> payload = old.checkpoint.payload;
  ByteReader in(payload, old.name);
  old.header = CheckpointHeader::decode(in);
  if (old.header.shard != id)
    fail(ErrorCode::corrupt_checkpoint, "{} holds shard {}", in.what(), old.header.shard.value);
  const uint64_t machine_at = in.position();
  ByteReader members = in;
  Membership(old.header.workers, old.header.workers).load(members);
  old.members = slice(payload, machine_at, members.position());
  StepMachine::skip_saved(in, old.header.workers);
  old.machine = slice(payload, machine_at, in.position());
  const uint64_t count = in.get<uint64_t>();
  uint64_t rows_at = 0;
  for (uint64_t i = 0; i < count; ++i)
    old.kinds.push_back(read_kind(in, payload, old.header, rows_at));
  if (!in.done() || rows_at != old.checkpoint.rows_bytes)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} bytes of rows where its tables hold {}", in.what(),
         old.checkpoint.rows_bytes, rows_at);
  return old;
}

// Shard `id`'s newest checkpoint in `dir`, read and checked; first restored with its logs into
// `restored`/shard-<id> (restore_shard) when it does not hold all the shard acknowledged,
// which takes options.replay.
OldShard read_shard(const fs::path& dir, ShardId id, const ReshardOptions& options,
                    const fs::path& restored, ReshardReport& report) {
  std::string why;
  ShardStore::Checkpoint found = newest_checkpoint(dir, id, why);
  if (options.replay) {
    ByteReader in(found.payload, found.file.string());
    check_replay_settings(*options.replay, options.replay_source, CheckpointHeader::decode(in),
                          found.file);
  }
  if (why.empty()) {
    std::string name = found.file.string();
    return parse_shard(std::move(found), std::move(name), id);
  }
  if (!options.replay)
    fail(ErrorCode::bad_config,
         "reshard: shard {} in {}: {}: give the job's deployment file (psched reshard "
         "--from-config FILE, the file its servers ran with), and reshard replays them as a "
         "start of its server would",
         id.value, dir.string(), why);
  ReshardReplay& replay = report.replayed.emplace_back();
  ShardStore::Checkpoint fresh =
      restore_shard(dir, id, *options.replay, restored / fmt::format("shard-{}", id.value), replay);
  return parse_shard(std::move(fresh),
                     fmt::format("shard {} as restored from {} and its logs", id.value,
                                 replay.checkpoint.string()),
                     id);
}

// The shards whose checkpoints are in `dirs`, by id; throws naming a shard found twice.
std::map<uint32_t, fs::path> find_shards(const std::vector<fs::path>& dirs) {
  static const std::regex kCheckpoint(R"(shard-(\d+)\.(\d+)\.ckpt)");
  std::map<uint32_t, fs::path> found;
  for (const fs::path& dir : dirs) {
    if (!fs::is_directory(dir))
      fail(ErrorCode::bad_config, "reshard: {} is no directory", dir.string());
    std::set<uint32_t> here;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::smatch match;
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, match, kCheckpoint)) here.insert(std::stoul(match[1].str()));
    }
    if (here.empty())
      fail(ErrorCode::bad_config,
           "reshard: {} holds no shard checkpoint (no shard-<id>.<generation>.ckpt file): name "
           "the job's checkpoint directory",
           dir.string());
    for (uint32_t id : here)
      if (auto [at, fresh] = found.emplace(id, dir); !fresh)
        fail(ErrorCode::bad_config, "reshard: shard {} has checkpoints in both {} and {}", id,
             at->second.string(), dir.string());
  }
  return found;
}

// Throws unless `shards` are one job's: the same job, mode, workers and slot map.
void check_one_job(const std::vector<OldShard>& shards) {
  const CheckpointHeader& first = shards[0].header;
  for (const OldShard& s : shards) {
    const CheckpointHeader& h = s.header;
    if (h.job != first.job || h.mode != first.mode || h.workers != first.workers ||
        !(h.map == first.map))
      fail(ErrorCode::bad_config,
           "reshard: {} and {} are not of one job: job {:016x} in {} mode with {} workers on "
           "slot map epoch {}, and job {:016x} in {} mode with {} workers on epoch {}",
           shards[0].name, s.name, first.job, to_string(first.mode), first.workers,
           first.map.epoch(), h.job, to_string(h.mode), h.workers, h.map.epoch());
  }
}

// The new shards' step machine record: shard 0's, with the job's membership merged from every
// shard's (Membership::save: the workers, then each one's step it joined from and whether it
// pushed since). The steps must agree (else a worker joined or left between the checkpoints:
// refused); a worker pushed since it joined where any shard saw it push (a shard holding
// nothing of what it pushes never does), so a restarted trainer joins at the job's step.
std::vector<std::byte> job_machine(const std::vector<OldShard>& shards) {
  std::vector<std::byte> merged = shards[0].members;
  for (const OldShard& s : shards) {
    ByteReader in(s.members, s.name), first(shards[0].members, shards[0].name);
    if (in.get<uint32_t>() != first.get<uint32_t>())
      fail(ErrorCode::corrupt_checkpoint, "{}: a membership of another size", s.name);
    for (size_t at = sizeof(uint32_t); !in.done(); at += sizeof(uint64_t) + 1) {
      if (in.get<uint64_t>() != first.get<uint64_t>())
        fail(ErrorCode::bad_config,
             "reshard: {} and {} hold different memberships (a worker joined or left between "
             "their checkpoints): start the servers until they agree, then reshard",
             shards[0].name, s.name);
      if (in.get<uint8_t>() != 0) merged[at + sizeof(uint64_t)] = std::byte{1};
      first.get<uint8_t>();
    }
  }
  std::vector<std::byte> machine = merged;
  machine.insert(machine.end(), shards[0].machine.begin() + static_cast<ptrdiff_t>(merged.size()),
                 shards[0].machine.end());
  return machine;
}

std::vector<OldShard> read_set(const ReshardOptions& options, const fs::path& restored,
                               ReshardReport& report) {
  if (options.from.empty()) fail(ErrorCode::bad_config, "reshard: no directory to read (--from)");
  const std::map<uint32_t, fs::path> found = find_shards(options.from);
  std::vector<OldShard> shards;
  for (const auto& [id, dir] : found)
    shards.push_back(read_shard(dir, ShardId(id), options, restored, report));
  check_one_job(shards);
  const uint32_t n = shards[0].header.map.shards();
  for (uint32_t id = 0; id < n; ++id)
    if (!found.contains(id))
      fail(ErrorCode::bad_config,
           "reshard: the set is incomplete: the job ran on {} shards and shard {} has no "
           "checkpoint in the directories given",
           n, id);
  for (const auto& [id, dir] : found)
    if (id >= n)
      fail(ErrorCode::bad_config, "reshard: {} holds shard {} of a job on {} shards", dir.string(),
           id, n);
  return shards;
}

[[noreturn]] void inside_a_step(const OldShard& shard, const std::string& name) {
  fail(ErrorCode::bad_config,
       "reshard: {} was taken inside a step ('{}' holds a step begun and not complete): stop the "
       "trainers between steps, then the servers (SIGTERM checkpoints them), and reshard",
       shard.name, name);
}

// The job's kinds, gathered from its old shards: a dense variable's parts by name (in element
// order), a table's heads by name (one an old shard), each in the order first met.
struct Kinds {
  std::vector<std::string> dense_names, table_names;
  std::map<std::string, std::vector<const OldKind*>> dense, tables;
};

// Throws unless a dense variable's parts cover it once, in one spec and one step.
void check_dense(const std::string& name, std::vector<const OldKind*>& parts,
                 const std::vector<OldShard>& shards) {
  std::sort(parts.begin(), parts.end(), [](const OldKind* a, const OldKind* b) {
    return a->variable->part().begin < b->variable->part().begin;
  });
  uint64_t next = 0;
  for (const OldKind* p : parts) {
    if (p->variable->part().begin != next ||
        !p->variable->spec().same_variable(parts[0]->variable->spec()))
      fail(ErrorCode::bad_config,
           "reshard: variable '{}' is held in parts that do not fit together (one at [{}, {}))",
           name, p->variable->part().begin, p->variable->part().end);
    next = p->variable->part().end;
    if (p->track != parts[0]->track ||
        p->variable->last_whole_t() != parts[0]->variable->last_whole_t())
      inside_a_step(shards[0], name);
  }
  if (next != parts[0]->variable->spec().elements())
    fail(ErrorCode::bad_config, "reshard: variable '{}' is held up to element {} of {}", name, next,
         parts[0]->variable->spec().elements());
}

void check_table(const std::string& name, const std::vector<const OldKind*>& heads,
                 const std::vector<OldShard>& shards) {
  if (heads.size() != shards.size())
    fail(ErrorCode::bad_config, "reshard: table '{}' is registered on {} of the {} shards", name,
         heads.size(), shards.size());
  const TableSpec& spec = heads[0]->table->spec();
  for (const OldKind* head : heads)
    if (!head->table->spec().same_table(spec) || head->track != heads[0]->track)
      fail(ErrorCode::bad_config,
           "reshard: table '{}' differs between shards (its spec, or the step it is at)", name);
}

Kinds gather(const std::vector<OldShard>& shards) {
  Kinds kinds;
  for (const OldShard& shard : shards)
    for (const OldKind& kind : shard.kinds) {
      if (!kind.between_steps) inside_a_step(shard, kind.name());
      auto& names = kind.variable ? kinds.dense_names : kinds.table_names;
      auto& by_name = kind.variable ? kinds.dense : kinds.tables;
      auto [at, fresh] = by_name.try_emplace(kind.name());
      if (fresh) names.push_back(kind.name());
      at->second.push_back(&kind);
    }
  for (auto& [name, parts] : kinds.dense) check_dense(name, parts, shards);
  for (const auto& [name, heads] : kinds.tables) check_table(name, heads, shards);
  return kinds;
}

// Range `range` of a dense variable made from its old `parts`: values and optimizer state.
Variable cut(const std::vector<const OldKind*>& parts, ElementRange range) {
  const VariableSpec& spec = parts[0]->variable->spec();
  const uint64_t bytes = element_bytes(spec.dtype);
  std::vector<std::byte> buffer(range.size() * bytes);
  auto copy = [&](const auto& read) {
    for (const OldKind* p : parts) {
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

void place_dense(const Kinds& kinds, const ReshardOptions& options, uint32_t from_shards,
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

// Calls `each(table, old shard, slot, row)` with every stored row of the old shards (its id,
// then its value and state; its slot there is its place in the stream), reading their files in
// order a row at a time through FileSource's buffer.
template <typename Each>
void for_each_row(const std::vector<OldShard>& shards, const Kinds& kinds, const Each& each) {
  for (uint32_t s = 0; s < shards.size(); ++s) {
    const ShardStore::Checkpoint& c = shards[s].checkpoint;
    FileSource rows(c.file, c.rows_offset, c.rows_bytes);
    std::vector<std::byte> row;
    for (const OldKind& kind : shards[s].kinds) {
      if (!kind.table) continue;
      const size_t table = static_cast<size_t>(
          std::find(kinds.table_names.begin(), kinds.table_names.end(), kind.name()) -
          kinds.table_names.begin());
      row.resize(kind.table->record_bytes());
      for (uint64_t slot = 0; slot < kind.rows; ++slot) {
        rows.read(row);
        each(table, s, static_cast<uint32_t>(slot), std::span<const std::byte>(row));
      }
    }
  }
}

uint64_t row_id(std::span<const std::byte> row) {
  uint64_t id = 0;
  std::memcpy(&id, row.data(), sizeof id);
  return id;
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
RowPlan count_rows(const std::vector<OldShard>& shards, const Kinds& kinds, const SlotMap& map,
                   ReshardReport& report) {
  RowPlan plan;
  std::vector<uint64_t> keys;
  for (const std::string& name : kinds.table_names) {
    keys.push_back(table_key(name));
    RowPlan::Table& t = plan.tables.emplace_back();
    t.rows.resize(map.shards());
    t.evicted.resize(map.shards());
    if (kinds.tables.at(name)[0]->table->spec().max_rows != 0)
      for (const OldKind* head : kinds.tables.at(name)) t.shard_of.emplace_back(head->rows);
  }
  for_each_row(shards, kinds,
               [&](size_t table, uint32_t old, uint32_t slot, std::span<const std::byte> row) {
                 const uint32_t shard = row_shard(keys[table], row_id(row), map);
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
void plan_bounded(const std::vector<const OldKind*>& heads, uint64_t max_rows, RowPlan::Table& t,
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
RowCapacity capacity_on(const std::vector<const OldKind*>& heads, const RowPlan::Table& t,
                        uint32_t shard) {
  const TableSpec& spec = heads[0]->table->spec();
  RowCapacity capacity(spec);
  for (const OldKind* head : heads) {
    capacity.merge_sketch(head->table->capacity());
    if (shard == 0)
      capacity.count(head->table->capacity().evictions(), head->table->capacity().dropped());
  }
  capacity.count(t.evicted[shard], 0);
  if (!t.order.empty())
    for (uint32_t slot : t.order[shard]) capacity.added(slot);
  return capacity;
}

void place_table_heads(const Kinds& kinds, const RowPlan& plan, std::vector<NewShard>& out) {
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
void copy_rows(const std::vector<OldShard>& shards, const Kinds& kinds, const SlotMap& map,
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
                 const uint32_t shard = row_shard(keys[table], row_id(row), map);
                 Pending& p = pending[table][shard];
                 p.bytes.insert(p.bytes.end(), row.begin(), row.end());
                 if (p.bytes.size() >= chunk[table]) flush(shard, p);
               });
  for (size_t table = 0; table < pending.size(); ++table)
    for (uint32_t shard = 0; shard < out.size(); ++shard)
      if (!pending[table][shard].bytes.empty()) flush(shard, pending[table][shard]);
}

void write_job(const std::vector<OldShard>& shards, const ReshardOptions& options,
               const fs::path& staging, ReshardReport& report) {
  const Kinds kinds = gather(shards);
  const std::vector<std::byte> machine = job_machine(shards);
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
  fs::path staging = options.to;
  staging += ".reshard-partial";
  fs::remove_all(staging);  // an interrupted reshard's
  try {
    ReshardReport report;
    const fs::path restored = staging / "restored";  // old shards restored from their logs
    const std::vector<OldShard> shards = read_set(options, restored, report);
    report.from_shards = shards[0].header.map.shards();
    report.map = shards[0].header.map.rebalanced(options.shards);
    report.slots_moved = shards[0].header.map.moved_to(report.map);
    write_job(shards, options, staging, report);
    fs::remove_all(restored);
    fs::rename(staging, options.to);
    return report;
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

}  // namespace psched
