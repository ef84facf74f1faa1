// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/shard_durability.h"

#include <algorithm>
#include <cstring>

#include "actors/durability/file_io.h"
#include "actors/durability/state_codec.h"
#include "common/error.h"
#include "common/log.h"
#include "common/shard_settings.h"
#include "common/wall_clock.h"

namespace psched {
namespace {

// Update log record kinds.
constexpr uint8_t kRegisterRecord = 'R';  // a dense variable's part registered
constexpr uint8_t kTableRecord = 'E';     // an embedding table registered
constexpr uint8_t kPushRecord = 'P';      // a push, of either kind (actors/shard/shard_request.h)
constexpr uint8_t kTimeoutRecord = 'T';   // a sync step completed without its missing workers
constexpr uint8_t kJoinRecord = 'J';      // a worker is a member from a step on
constexpr uint8_t kLeaveRecord = 'L';     // a worker is no member any more

}  // namespace

void CheckpointHeader::encode(ByteWriter& out) const {
  out.put(shard.value);
  out.put(static_cast<uint8_t>(mode));
  out.put(workers);
  out.put(job);
  map.encode(out);
  out.put(generation);
  out.put(written_at_ns);
}

CheckpointHeader CheckpointHeader::decode(ByteReader& in) {
  CheckpointHeader h{.shard = ShardId(in.get<uint32_t>())};
  const auto mode = in.get<uint8_t>();
  if (mode > static_cast<uint8_t>(Mode::bounded))
    fail(ErrorCode::corrupt_checkpoint, "{}: unknown mode {}", in.what(), mode);
  h.mode = static_cast<Mode>(mode);
  h.workers = in.get<uint32_t>();
  h.job = in.get<uint64_t>();
  h.map = SlotMap::decode(in);
  if (h.shard.value >= h.map.shards())
    fail(ErrorCode::corrupt_checkpoint, "{}: shard {} of a slot map on {} shards", in.what(),
         h.shard.value, h.map.shards());
  h.generation = in.get<uint64_t>();
  h.written_at_ns = in.get<int64_t>();
  return h;
}

ShardDurability::ShardDurability(ActorLoop& loop, const ShardSettings& settings, State& state)
    : loop_(loop),
      settings_(settings),
      state_(state),
      job_(settings.job),
      map_(SlotMap::even(settings.shards)) {}

ShardDurability::~ShardDurability() {
  *alive_ = false;
}

void ShardDurability::append(ByteWriter& record) {
  store_->append(record.bytes());
}

void ShardDurability::log_register(const VariableSpec& spec, ElementRange part,
                                   std::span<const std::byte> initial) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kRegisterRecord);
  encode(record, spec);
  encode(record, part);
  record.blob(initial);
  append(record);
}

void ShardDurability::log_push(const Push& push) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kPushRecord);
  record.put(push.worker.value);
  record.put(push.variable.value);
  record.put(push.step.value);
  encode(record, push.range);
  record.put(static_cast<uint8_t>(push.dtype));
  record.put(static_cast<uint8_t>(push.gradient));
  record.put<uint8_t>(push.rows);
  record.blob(std::as_bytes(push.ids));  // in the machine's byte order: a log is read where written
  record.blob(push.data);
  append(record);
}

void ShardDurability::log_register_table(const TableSpec& spec) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kTableRecord);
  encode_table_spec(record, spec);
  append(record);
}

void ShardDurability::replay_push(ByteReader& record) {
  Push push{.worker = WorkerId(record.get<uint32_t>()),
            .variable = VariableId(record.get<uint32_t>()),
            .step = Step(record.get<uint64_t>())};
  push.range = decode_range(record);
  const auto dtype = record.get<uint8_t>();
  const auto gradient = record.get<uint8_t>();
  if (dtype > static_cast<uint8_t>(DType::float64) ||
      gradient > static_cast<uint8_t>(PushedGradient::sparse))
    fail(ErrorCode::corrupt_checkpoint, "{}: a push of dtype {}, gradient {}", record.what(), dtype,
         gradient);
  push.dtype = static_cast<DType>(dtype);
  push.gradient = static_cast<PushedGradient>(gradient);
  push.rows = record.get<uint8_t>() != 0;
  const std::span<const std::byte> id_bytes = record.blob();
  if (id_bytes.size() % sizeof(uint64_t) != 0)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} bytes of row ids", record.what(), id_bytes.size());
  std::vector<uint64_t> ids(id_bytes.size() / sizeof(uint64_t));
  std::memcpy(ids.data(), id_bytes.data(), id_bytes.size());
  push.ids = ids;
  push.data = record.blob();
  state_.replay_push(push);
}

void ShardDurability::log_timeout(VariableId id, Step step) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kTimeoutRecord);
  record.put(id.value);
  record.put(step.value);
  append(record);
}

void ShardDurability::log_join(WorkerId worker, Step from) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kJoinRecord);
  record.put(worker.value);
  record.put(from.value);
  append(record);
}

void ShardDurability::log_leave(WorkerId worker) {
  if (!store_ || !store_->logging()) return;
  ByteWriter record;
  record.put(kLeaveRecord);
  record.put(worker.value);
  append(record);
}

void ShardDurability::replay(ByteReader& record) {
  const uint8_t kind = record.get<uint8_t>();
  switch (kind) {
    case kPushRecord:
      return replay_push(record);
    case kRegisterRecord: {
      VariableSpec spec = decode_spec(record);
      ElementRange part = decode_range(record);
      return state_.replay_register(spec, part, record.blob());
    }
    case kTableRecord: {
      TableSpec spec = decode_table_spec(record);
      return state_.replay_register_table(spec);
    }
    case kTimeoutRecord: {
      VariableId id(record.get<uint32_t>());
      return state_.replay_timeout(id, Step(record.get<uint64_t>()), record.what());
    }
    case kJoinRecord: {
      WorkerId worker(record.get<uint32_t>());
      return state_.replay_join(worker, Step(record.get<uint64_t>()), record.what());
    }
    case kLeaveRecord:
      return state_.replay_leave(WorkerId(record.get<uint32_t>()), record.what());
    default:
      fail(ErrorCode::corrupt_checkpoint, "{}: unknown record kind {}", record.what(), kind);
  }
}

std::vector<std::byte> ShardDurability::snapshot() {
  ByteWriter out;
  CheckpointHeader{settings_.id, settings_.mode, settings_.workers, job_,
                   map_,         generation_,    wall_clock_ns()}
      .encode(out);
  state_.save_variables(out);
  return std::move(out.bytes());
}

std::vector<std::byte> ShardDurability::begin_checkpoint() {
  // The new log first: when it cannot be created, nothing changes and the old one stays.
  if (settings_.update_log) store_->start_log(generation_ + 1);
  ++generation_;
  return snapshot();
}

void ShardDurability::restore(RestoreReport& report) {
  if (settings_.checkpoint_directory.empty())
    fail(ErrorCode::bad_config, "shard {} has no checkpoint directory", settings_.id.value);
  auto store = std::make_unique<ShardStore>(settings_.checkpoint_directory, settings_.id);
  auto found = store->load_latest(report.skipped);
  if (!found && !report.skipped.empty())
    fail(ErrorCode::corrupt_checkpoint,
         "shard {}: no valid checkpoint in {} ({} corrupt; move them away to start empty): {}",
         settings_.id.value, settings_.checkpoint_directory.string(), report.skipped.size(),
         report.skipped.front());
  if (found) {
    ByteReader in(found->payload, found->file.string());
    FileSource rows(found->file, found->rows_offset, found->rows_bytes);
    load(in, rows);
    if (!rows.done())
      fail(ErrorCode::corrupt_checkpoint, "{}: rows after the last table's", found->file.string());
    report.checkpoint = found->file;
  }
  // Nothing is logged while replaying: store_ is still unset.
  auto replayed = store->replay(
      found ? &*found : nullptr, [this](ByteReader& record) { replay(record); },
      {.expect_logs = settings_.update_log, .accept_loss = settings_.accept_log_loss});
  report.replayed = replayed.replayed;
  report.skipped.insert(report.skipped.end(), replayed.dropped.begin(), replayed.dropped.end());
  report.lost = std::move(replayed.lost);
  if (!report.lost.empty())
    log_error(
        "{}; GOING ON WITHOUT THEM (--accept-log-loss): the shard is rolled back to "
        "what it held before that point",
        report.lost);
  // Past every file there is, so the fresh checkpoint and log replace none of them.
  generation_ = std::max(found ? found->generation : 0, store->newest_generation());
  store_ = std::move(store);
  report.written = checkpoint_now();
}

std::filesystem::path ShardDurability::checkpoint_now() {
  std::vector<std::byte> payload = begin_checkpoint();
  std::unique_ptr<ShardStore::CheckpointFile> file;
  const uint64_t rows = state_.freeze_rows(
      [&file](uint64_t offset, std::vector<std::byte> bytes) { file->write_rows(offset, bytes); });
  file = store_->open_checkpoint(generation_, payload, rows);
  while (state_.save_rows()) {
  }
  return file->finish();
}

CheckpointHeader ShardDurability::take_header(ByteReader& in, bool serving) {
  CheckpointHeader h = CheckpointHeader::decode(in);
  if (h.shard != settings_.id ||
      (!serving && (h.mode != settings_.mode || h.workers != settings_.workers)))
    fail(ErrorCode::bad_config,
         "{} holds shard {} in {} mode with {} workers; this deployment runs shard {} in {} mode "
         "with {} workers",
         in.what(), h.shard.value, to_string(h.mode), h.workers, settings_.id.value,
         to_string(settings_.mode), settings_.workers);
  if (h.map.shards() != settings_.shards)
    fail(ErrorCode::bad_config,
         "{} holds shard {} of a job on {} shards; this deployment has {}: place the job's "
         "checkpoints on {} shards first (psched reshard --shards {})",
         in.what(), h.shard.value, h.map.shards(), settings_.shards, settings_.shards,
         settings_.shards);
  job_ = h.job;
  map_ = h.map;
  return h;
}

void ShardDurability::load(ByteReader& in, ByteSource& rows) {
  take_header(in, false);
  state_.load_variables(in, rows);
  if (!in.done())
    fail(ErrorCode::corrupt_checkpoint, "{}: {} bytes after the last variable", in.what(),
         in.position());
}

ShardStore::Checkpoint ShardDurability::newest_served(const ShardSettings& settings) {
  const std::filesystem::path& directory = settings.serve_directory;
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error))
    fail(ErrorCode::bad_config, "shard {}: --serve {}: no such directory", settings.id.value,
         directory.string());
  const ShardStore store(directory, settings.id);
  std::vector<std::string> skipped;
  auto found = store.load_latest(skipped);
  for (const std::string& reason : skipped)
    log_warn("shard {}: serving: skipped {}", settings.id.value, reason);
  if (!found && std::filesystem::exists(directory / "manifest.json"))
    fail(ErrorCode::bad_config,
         "shard {}: --serve {}: an export folder, not checkpoints; make it the checkpoints of "
         "this deployment's shards first (psched import --from {} --to-config DEPLOYMENT.yaml, "
         "from an export written with --with-optimizer-state), then serve their directory",
         settings.id.value, directory.string(), directory.string());
  if (!found)
    fail(ErrorCode::bad_config, "shard {}: --serve {}: no valid checkpoint of shard {} there{}",
         settings.id.value, directory.string(), settings.id.value,
         skipped.empty() ? "" : fmt::format(" ({} damaged: {})", skipped.size(), skipped.front()));
  return std::move(*found);
}

ServedVersion ShardDurability::load_served(const ShardStore::Checkpoint& found) {
  ByteReader in(found.payload, found.file.string());
  FileSource rows(found.file, found.rows_offset, found.rows_bytes);
  const CheckpointHeader h = take_header(in, true);
  state_.load_variables(in, rows);
  if (!in.done() || !rows.done())
    fail(ErrorCode::corrupt_checkpoint, "{}: bytes after the last variable", in.what());
  return ServedVersion{.checkpoint = found.file,
                       .generation = found.generation,
                       .written_at_ns = h.written_at_ns,
                       .loaded_at_ns = wall_clock_ns()};
}

// A checkpoint on its way: the file lives on the writer thread (opened by its first task);
// the loop counts the chunks handed to the writer and not yet written.
struct ShardDurability::Stream {
  uint64_t generation = 0;
  Done done;
  std::unique_ptr<ShardStore::CheckpointFile> file;  // the writer thread's
  std::exception_ptr error;                          // the writer thread's, first one
  size_t in_flight = 0;                              // the loop's
  bool encoded = false;                              // the loop's: every row is handed over
};

void ShardDurability::checkpoint(Done done) {
  if (!store_)
    fail(ErrorCode::bad_config, "shard {}: checkpoint before restore, or no directory",
         settings_.id.value);
  if (stream_) return waiting_.push_back(std::move(done));
  start_checkpoint(std::move(done));
}

void ShardDurability::start_checkpoint(Done done) {
  auto payload = std::make_shared<std::vector<std::byte>>(begin_checkpoint());
  stream_ = std::make_shared<Stream>();
  stream_->generation = generation_;
  stream_->done = std::move(done);
  const uint64_t rows = state_.freeze_rows([this](uint64_t offset, std::vector<std::byte> bytes) {
    write_rows(offset, std::move(bytes));
  });
  if (!writer_) writer_ = std::make_unique<boost::asio::thread_pool>(1);
  // The file is written off the loop: updates go on meanwhile, into the new log.
  boost::asio::post(*writer_, [this, stream = stream_, payload, rows] {
    try {
      stream->file = store_->open_checkpoint(stream->generation, *payload, rows);
    } catch (...) {
      stream->error = std::current_exception();
    }
  });
  pump();
}

void ShardDurability::write_rows(uint64_t offset, std::vector<std::byte> rows) {
  ++stream_->in_flight;
  boost::asio::post(*writer_,
                    [this, stream = stream_, offset, rows = std::move(rows), alive = alive_] {
                      try {
                        if (!stream->error) stream->file->write_rows(offset, rows);
                      } catch (...) {
                        stream->error = std::current_exception();
                      }
                      loop_.post([this, stream, alive] {
                        if (!*alive) return;
                        --stream->in_flight;
                        if (stream == stream_) pump();
                      });
                    });
}

void ShardDurability::pump() {
  Stream& stream = *stream_;
  while (!stream.encoded && stream.in_flight < kChunksInFlight)
    stream.encoded = !state_.save_rows();
  if (stream.encoded && stream.in_flight == 0) finish_checkpoint();
}

void ShardDurability::finish_checkpoint() {
  boost::asio::post(*writer_, [this, stream = std::move(stream_), alive = alive_]() mutable {
    std::filesystem::path file;
    try {
      if (stream->error) std::rethrow_exception(stream->error);
      file = stream->file->finish();
    } catch (...) {
      stream->error = std::current_exception();
    }
    stream->file.reset();  // an unfinished one removes its temporary file
    loop_.post([this, stream, file, alive = std::move(alive)] {
      if (!*alive) return;
      stream->done(stream->error, file);
      if (waiting_.empty() || stream_) return;
      Done next = std::move(waiting_.front());
      waiting_.erase(waiting_.begin());
      try {
        start_checkpoint(next);
      } catch (...) {
        next(std::current_exception(), {});
      }
    });
  });
}

}  // namespace psched
