// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/checkpoint_set.h"

#include <algorithm>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <kj/async.h>

#include "actors/durability/update_log.h"
#include "actors/runtime/actor.h"
#include "actors/shard/step_machine.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"
#include "common/result.h"

namespace psched {
namespace {

namespace fs = std::filesystem;

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

// Throws unless `options.replay` are the settings of the job whose checkpoint `file` begins with
// `header`: its mode, workers and shard count.
void check_replay_settings(const CheckpointSetOptions& options, const CheckpointHeader& header,
                           const fs::path& file) {
  const ShardSettings& settings = *options.replay;
  if (settings.mode == header.mode && settings.workers == header.workers &&
      settings.shards == header.map.shards())
    return;
  fail(ErrorCode::bad_config,
       "{}: {} runs {} mode with {} workers on {} shards, and {} holds shard {} of a job in {} "
       "mode with {} workers on {} shards: give the deployment file the job's servers ran with",
       options.tool, options.replay_source, to_string(settings.mode), settings.workers,
       settings.shards, file.string(), header.shard.value, to_string(header.mode), header.workers,
       header.map.shards());
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
void copy_shard_files(const fs::path& dir, ShardId id, const fs::path& scratch,
                      std::string_view tool) {
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
    fail(ErrorCode::io_error, "{}: cannot copy shard {}'s files from {} into {}: {}", tool,
         id.value, dir.string(), scratch.string(), e.what());
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

// Shard `id` of `dir` restored as its server's start restores it, under options.replay, from
// its files copied into `scratch` (copy_shard_files). Returns the fresh checkpoint the restore
// wrote there, and says in `replay` what it replayed. Throws what the restore throws (a damaged
// log: Error(corrupt_checkpoint) naming the file of `dir` and the byte).
ShardStore::Checkpoint restore_shard(const fs::path& dir, ShardId id,
                                     const CheckpointSetOptions& options, const fs::path& scratch,
                                     ShardReplay& replay) {
  copy_shard_files(dir, id, scratch, options.tool);
  ShardSettings settings = *options.replay;
  settings.id = id;
  settings.checkpoint_directory = scratch;
  RestoreReport restored;
  try {
    restored = restore_on_a_loop(settings);
  } catch (...) {
    const Error e = caught();
    fail(e.code(), "{}: {}", options.tool, as_original(e.what(), scratch, dir));
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
    fail(ErrorCode::internal, "{}: shard {}'s restored checkpoint {} does not read back",
         options.tool, id.value, restored.written.string());
  return std::move(*fresh);
}

// The kind whose record starts at `in` (VariableShard::save_variables' layout), `payload` the
// bytes `in` reads.
SavedKind read_kind(ByteReader& in, std::span<const std::byte> payload,
                    const CheckpointHeader& header, uint64_t& rows_at) {
  SavedKind kind;
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
  kind.step = track.latest_step();
  kind.track = slice(payload, track_at, in.position());
  const uint64_t sums_at = in.position();
  hosted.load_sums(in);
  kind.sums = slice(payload, sums_at, in.position());
  return kind;
}

// Shard `id`'s newest valid checkpoint in `dir`, and in `why` what it does not hold
// (unreplayed); throws when there is none.
ShardStore::Checkpoint newest_checkpoint(const fs::path& dir, ShardId id, std::string_view tool,
                                         std::string& why) {
  ShardStore store(dir, id);
  std::vector<std::string> skipped;
  std::optional<ShardStore::Checkpoint> found = store.load_latest(skipped);
  if (!found)
    fail(ErrorCode::bad_config, "{}: shard {} has no valid checkpoint in {}{}", tool, id.value,
         dir.string(), skipped.empty() ? "" : ": " + skipped.front());
  why = unreplayed(store, *found, skipped);
  return std::move(*found);
}

// The shard whose checkpoint is `checkpoint`, read and checked; `name` names it in messages.
SavedShard parse_shard(ShardStore::Checkpoint checkpoint, std::string name, ShardId id) {
  SavedShard saved{.checkpoint = std::move(checkpoint), .name = std::move(name)};
  const std::span<const std::byte> payload = saved.checkpoint.payload;
  ByteReader in(payload, saved.name);
  saved.header = CheckpointHeader::decode(in);
  if (saved.header.shard != id)
    fail(ErrorCode::corrupt_checkpoint, "{} holds shard {}", in.what(), saved.header.shard.value);
  const uint64_t machine_at = in.position();
  ByteReader members = in;
  Membership(saved.header.workers, saved.header.workers).load(members);
  saved.members = slice(payload, machine_at, members.position());
  StepMachine::skip_saved(in, saved.header.workers);
  saved.machine = slice(payload, machine_at, in.position());
  const uint64_t count = in.get<uint64_t>();
  uint64_t rows_at = 0;
  for (uint64_t i = 0; i < count; ++i)
    saved.kinds.push_back(read_kind(in, payload, saved.header, rows_at));
  if (!in.done() || rows_at != saved.checkpoint.rows_bytes)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} bytes of rows where its tables hold {}", in.what(),
         saved.checkpoint.rows_bytes, rows_at);
  return saved;
}

// Shard `id`'s newest checkpoint in `dir`, read and checked; first restored with its logs into
// options.scratch/shard-<id> (restore_shard) when it does not hold all the shard acknowledged,
// which takes options.replay.
SavedShard read_shard(const fs::path& dir, ShardId id, const CheckpointSetOptions& options,
                      std::vector<ShardReplay>& replayed) {
  std::string why;
  ShardStore::Checkpoint found = newest_checkpoint(dir, id, options.tool, why);
  if (options.replay) {
    ByteReader in(found.payload, found.file.string());
    check_replay_settings(options, CheckpointHeader::decode(in), found.file);
  }
  if (why.empty()) {
    std::string name = found.file.string();
    return parse_shard(std::move(found), std::move(name), id);
  }
  if (!options.replay)
    fail(ErrorCode::bad_config,
         "{}: shard {} in {}: {}: give the job's deployment file (psched {} --from-config FILE, "
         "the file its servers ran with), and {} replays them as a start of its server would",
         options.tool, id.value, dir.string(), why, options.tool, options.tool);
  ShardReplay& replay = replayed.emplace_back();
  ShardStore::Checkpoint fresh =
      restore_shard(dir, id, options, options.scratch / fmt::format("shard-{}", id.value), replay);
  return parse_shard(std::move(fresh),
                     fmt::format("shard {} as restored from {} and its logs", id.value,
                                 replay.checkpoint.string()),
                     id);
}

// The shards whose checkpoints are in `dirs`, by id; throws naming a directory that is none or
// holds no shard's checkpoint, and a shard found twice.
std::map<uint32_t, fs::path> find_shards(const std::vector<fs::path>& dirs, std::string_view tool) {
  // At most 9 digits of shard id (a uint32_t holds them) and 19 of generation (a uint64_t's,
  // as ShardStore reads it): a longer name is no shard's checkpoint.
  static const std::regex kCheckpoint(R"(shard-(\d{1,9})\.(\d{1,19})\.ckpt)");
  std::map<uint32_t, fs::path> found;
  for (const fs::path& dir : dirs) {
    if (!fs::is_directory(dir))
      fail(ErrorCode::bad_config, "{}: {} is no directory", tool, dir.string());
    std::set<uint32_t> here;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::smatch match;
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, match, kCheckpoint)) here.insert(std::stoul(match[1].str()));
    }
    if (here.empty())
      fail(ErrorCode::bad_config,
           "{}: {} holds no shard checkpoint (no shard-<id>.<generation>.ckpt file): name the "
           "job's checkpoint directory",
           tool, dir.string());
    for (uint32_t id : here)
      if (auto [at, fresh] = found.emplace(id, dir); !fresh)
        fail(ErrorCode::bad_config, "{}: shard {} has checkpoints in both {} and {}", tool, id,
             at->second.string(), dir.string());
  }
  return found;
}

// Throws unless `shards` are one job's: the same job, mode, workers and slot map, and
// memberships that agree (job_machine).
void check_one_job(const std::vector<SavedShard>& shards, std::string_view tool) {
  const CheckpointHeader& first = shards[0].header;
  for (const SavedShard& s : shards) {
    const CheckpointHeader& h = s.header;
    if (h.job != first.job || h.mode != first.mode || h.workers != first.workers ||
        !(h.map == first.map))
      fail(ErrorCode::bad_config,
           "{}: {} and {} are not of one job: job {:016x} in {} mode with {} workers on "
           "slot map epoch {}, and job {:016x} in {} mode with {} workers on epoch {}",
           tool, shards[0].name, s.name, first.job, to_string(first.mode), first.workers,
           first.map.epoch(), h.job, to_string(h.mode), h.workers, h.map.epoch());
  }
  job_machine(shards, tool);
}

[[noreturn]] void inside_a_step(const SavedShard& shard, const std::string& name,
                                std::string_view tool) {
  fail(ErrorCode::bad_config,
       "{}: {} was taken inside a step ('{}' holds a step begun and not complete): stop the "
       "trainers between steps, then the servers (SIGTERM checkpoints them), and {}",
       tool, shard.name, name, tool);
}

// Throws unless a dense variable's parts cover it once, in one spec and one step.
void check_dense(const std::string& name, std::vector<const SavedKind*>& parts,
                 const std::vector<SavedShard>& shards, std::string_view tool) {
  std::sort(parts.begin(), parts.end(), [](const SavedKind* a, const SavedKind* b) {
    return a->variable->part().begin < b->variable->part().begin;
  });
  uint64_t next = 0;
  for (const SavedKind* p : parts) {
    if (p->variable->part().begin != next ||
        !p->variable->spec().same_variable(parts[0]->variable->spec()))
      fail(ErrorCode::bad_config,
           "{}: variable '{}' is held in parts that do not fit together (one at [{}, {}))", tool,
           name, p->variable->part().begin, p->variable->part().end);
    next = p->variable->part().end;
    if (p->track != parts[0]->track ||
        p->variable->last_whole_t() != parts[0]->variable->last_whole_t())
      inside_a_step(shards[0], name, tool);
  }
  if (next != parts[0]->variable->spec().elements())
    fail(ErrorCode::bad_config, "{}: variable '{}' is held up to element {} of {}", tool, name,
         next, parts[0]->variable->spec().elements());
}

void check_table(const std::string& name, const std::vector<const SavedKind*>& heads,
                 const std::vector<SavedShard>& shards, std::string_view tool) {
  if (heads.size() != shards.size())
    fail(ErrorCode::bad_config, "{}: table '{}' is registered on {} of the {} shards", tool, name,
         heads.size(), shards.size());
  const TableSpec& spec = heads[0]->table->spec();
  for (const SavedKind* head : heads)
    if (!head->table->spec().same_table(spec) || head->track != heads[0]->track)
      fail(ErrorCode::bad_config,
           "{}: table '{}' differs between shards (its spec, or the step it is at)", tool, name);
}

}  // namespace

std::vector<SavedShard> read_checkpoint_set(const CheckpointSetOptions& options,
                                            std::vector<ShardReplay>& replayed) {
  const std::string_view tool = options.tool;
  if (options.dirs.empty()) fail(ErrorCode::bad_config, "{}: no directory to read (--from)", tool);
  const std::map<uint32_t, fs::path> found = find_shards(options.dirs, tool);
  std::vector<SavedShard> shards;
  for (const auto& [id, dir] : found)
    shards.push_back(read_shard(dir, ShardId(id), options, replayed));
  check_one_job(shards, tool);
  const uint32_t n = shards[0].header.map.shards();
  for (uint32_t id = 0; id < n; ++id)
    if (!found.contains(id))
      fail(ErrorCode::bad_config,
           "{}: the set is incomplete: the job ran on {} shards and shard {} has no "
           "checkpoint in the directories given",
           tool, n, id);
  for (const auto& [id, dir] : found)
    if (id >= n)
      fail(ErrorCode::bad_config, "{}: {} holds shard {} of a job on {} shards", tool, dir.string(),
           id, n);
  return shards;
}

std::vector<std::byte> job_machine(const std::vector<SavedShard>& shards, std::string_view tool) {
  std::vector<std::byte> merged = shards[0].members;
  for (const SavedShard& s : shards) {
    ByteReader in(s.members, s.name), first(shards[0].members, shards[0].name);
    if (in.get<uint32_t>() != first.get<uint32_t>())
      fail(ErrorCode::corrupt_checkpoint, "{}: a membership of another size", s.name);
    for (size_t at = sizeof(uint32_t); !in.done(); at += sizeof(uint64_t) + 1) {
      if (in.get<uint64_t>() != first.get<uint64_t>())
        fail(ErrorCode::bad_config,
             "{}: {} and {} hold different memberships (a worker joined or left between their "
             "checkpoints): start the servers until they agree, then {}",
             tool, shards[0].name, s.name, tool);
      if (in.get<uint8_t>() != 0) merged[at + sizeof(uint64_t)] = std::byte{1};
      first.get<uint8_t>();
    }
  }
  std::vector<std::byte> machine = merged;
  machine.insert(machine.end(), shards[0].machine.begin() + static_cast<ptrdiff_t>(merged.size()),
                 shards[0].machine.end());
  return machine;
}

SavedKinds gather_kinds(const std::vector<SavedShard>& shards, std::string_view tool) {
  SavedKinds kinds;
  for (const SavedShard& shard : shards)
    for (const SavedKind& kind : shard.kinds) {
      if (!kind.between_steps) inside_a_step(shard, kind.name(), tool);
      auto& names = kind.variable ? kinds.dense_names : kinds.table_names;
      auto& by_name = kind.variable ? kinds.dense : kinds.tables;
      auto [at, fresh] = by_name.try_emplace(kind.name());
      if (fresh) names.push_back(kind.name());
      at->second.push_back(&kind);
    }
  for (auto& [name, parts] : kinds.dense) check_dense(name, parts, shards, tool);
  for (const auto& [name, heads] : kinds.tables) check_table(name, heads, shards, tool);
  return kinds;
}

}  // namespace psched
