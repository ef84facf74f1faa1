// SPDX-License-Identifier: Apache-2.0
// psched reshard (actors/shard/reshard.h) on the checkpoints and update logs of real
// VariableShards: a job on N shards placed on M holds every row, value and optimizer state where
// the new slot map puts them, bit for bit, and trains on, whether its last steps were
// checkpointed or are in the logs alone; a set it cannot place is refused naming why, writing
// nothing.
#include "actors/shard/reshard.h"

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "actors/durability/shard_store.h"
#include "actors/durability/temp_dir.h"
#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"
#include "common/placement.h"

using namespace psched;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kRows = 200;
constexpr uint64_t kSplitBytes = 64;  // "big" (40 floats) is split, "w" (3 floats) is not

TableSpec table_spec(uint64_t max_rows = 0, uint32_t admit_after = 0) {
  TableSpec spec{.name = "t", .num_embeddings = kRows, .dim = 2, .dtype = DType::float64};
  spec.max_rows = max_rows;
  spec.admit_after = admit_after;
  spec.optimizer.kind = optim::RowOptimizerKind::adagrad;
  spec.optimizer.lr = 0.5;
  spec.init = {RowInit::Kind::uniform, -1, 1};
  spec.seed = 7;
  return spec;
}

VariableSpec dense_spec(std::string name, uint64_t elements) {
  VariableSpec spec{.name = std::move(name), .shape = {elements}};
  spec.optimizer.kind = optim::OptimizerKind::adam;
  spec.optimizer.lr = 0.1;
  return spec;
}

// One shard of a job, on the job's loop.
struct Shard {
  testing::TestLoop& io;
  VariableShard shard;
  std::vector<std::vector<uint64_t>> kept;  // ids borrowed by polls

  Shard(testing::TestLoop& loop, uint32_t id, uint32_t shards, const fs::path& dir, uint64_t job,
        Mode mode = Mode::async)
      : io(loop),
        shard(io.actors,
              ShardSettings{ShardId(id), mode, 1, 64, dir, true, {}, false, 0, {}, shards, job}) {}

  VariableId registered(const std::function<void(VariableShard::RegisterReply)>& call) {
    std::optional<Result<VariableShard::Registration>> r;
    call([&](const Result<VariableShard::Registration>& answer) { r = answer; });
    io.drain();
    REQUIRE(r);
    if (!*r) throw r->error();
    return (*r)->id;
  }
  VariableId table(const TableSpec& spec) {
    return registered([&](auto reply) { shard.register_table(spec, reply); });
  }
  VariableId variable(const VariableSpec& spec, ElementRange part) {
    std::vector<float> initial(part.size());
    std::iota(initial.begin(), initial.end(), static_cast<float>(part.begin));
    return registered([&](auto reply) {
      shard.register_variable(spec, part, testing::bytes_of(initial), reply);
    });
  }
  void push(const Push& push) {
    testing::Receipted receipt;
    shard.push(push, receipt.reply());
    io.drain();
    REQUIRE(receipt.taken());
  }
  std::vector<double> rows(VariableId table, std::vector<uint64_t> ids) {
    kept.push_back(std::move(ids));
    std::optional<std::vector<double>> value;
    shard.poll({WorkerId(0), table, Step(), {}, PollTicket(kept.size()), true, kept.back()},
               [&](const Result<FreshValue>& answer) {
                 REQUIRE(answer);
                 value.emplace(answer->bytes() / sizeof(double));
                 answer->read_into(std::as_writable_bytes(std::span(*value)));
               });
    io.drain();
    REQUIRE(value);
    return *value;
  }
  std::vector<float> values(VariableId variable, ElementRange range) {
    testing::Answered answer;
    shard.pull(variable, range, answer.reply());
    io.drain();
    REQUIRE(answer.value);
    return *answer.value;
  }
};

// A job's shards on one loop, restored from (or started in) `dir`, placing by their slot map.
struct Job {
  testing::TestLoop io;
  std::vector<std::unique_ptr<Shard>> shards;
  SlotMap map;
  TableSpec table = table_spec();

  Job(uint32_t count, const fs::path& dir, uint64_t job = 1, Mode mode = Mode::async) {
    for (uint32_t i = 0; i < count; ++i) {
      shards.push_back(std::make_unique<Shard>(io, i, count, dir, job, mode));
      testing::restored(shards.back()->io, shards.back()->shard);
    }
    map = shards[0]->shard.slot_map();
  }
  uint32_t owner(uint64_t id) const { return row_shard(table_key("t"), id, map); }
  std::vector<VariableId> tables() {
    std::vector<VariableId> ids;
    for (auto& s : shards) ids.push_back(s->table(table));
    return ids;
  }
  // Every dense variable's parts: (shard, id, range).
  std::vector<std::tuple<uint32_t, VariableId, ElementRange>> variables(const VariableSpec& spec) {
    std::vector<std::tuple<uint32_t, VariableId, ElementRange>> out;
    for (const ShardPart& p : place_variable(spec.name, spec.elements(), 4, map, kSplitBytes))
      out.emplace_back(p.shard.value, shards[p.shard.value]->variable(spec, p.range), p.range);
    return out;
  }
  // Worker 0's step `step`: a gradient for every row and every element.
  void train(uint64_t step) {
    const auto t = tables();
    for (uint32_t s = 0; s < shards.size(); ++s) {
      std::vector<uint64_t> ids;
      std::vector<double> g;
      for (uint64_t id = 0; id < kRows; id += 1 + id % 3)
        if (owner(id) == s) {
          ids.push_back(id);
          g.push_back(0.01 * static_cast<double>(id) - 0.3 * static_cast<double>(step));
          g.push_back(0.02 * static_cast<double>(step));
        }
      shards[s]->push({.worker = WorkerId(0),
                       .variable = t[s],
                       .step = Step(step),
                       .dtype = DType::float64,
                       .data = std::as_bytes(std::span(g)),
                       .rows = true,
                       .ids = ids});
    }
    for (const auto& spec : {dense_spec("w", 3), dense_spec("big", 40)})
      for (auto [s, id, range] : variables(spec)) {
        std::vector<float> g(range.size());
        for (uint64_t e = range.begin; e < range.end; ++e)
          g[e - range.begin] = 0.1f * static_cast<float>(e) - static_cast<float>(step);
        shards[s]->push({WorkerId(0), id, Step(step), range, DType::float32, testing::bytes_of(g)});
      }
  }
  void checkpoint() {
    for (auto& s : shards) testing::checkpointed(s->io, s->shard);
  }
  // Every row of "t", then every element of each dense variable, from its owner.
  std::vector<double> everything() {
    std::vector<double> out;
    const auto t = tables();
    for (uint64_t id = 0; id < kRows; ++id)
      for (double x : shards[owner(id)]->rows(t[owner(id)], {id})) out.push_back(x);
    for (const auto& spec : {dense_spec("w", 3), dense_spec("big", 40)})
      for (auto [s, id, range] : variables(spec))
        for (float x : shards[s]->values(id, range)) out.push_back(x);
    return out;
  }
};

std::string refusal(const ReshardOptions& options) {
  try {
    reshard(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no refusal)";
}

// The settings a Job's shards run with (any shard's): what its logs are replayed under.
ShardSettings job_settings(uint32_t shards) {
  return {ShardId(0), Mode::async, 1, 64, {}, true, {}, false, 0, {}, shards, 1};
}

// Every file of `dir`, by name: its bytes.
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().filename().string()].assign(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// The newest update log of shard `id` in `dir`.
fs::path newest_log(const fs::path& dir, uint32_t id) {
  ShardStore store(dir, ShardId(id));
  return store.log_file(store.newest_generation());
}

// A job on 2 shards in `dir` that trained steps 1 to `steps` and checkpointed after step 2:
// its later steps are in its update logs alone, as a SIGKILL leaves them.
std::vector<double> killed_after(const fs::path& dir, uint64_t steps) {
  Job job(2, dir);
  for (uint64_t step = 1; step <= steps; ++step) {
    job.train(step);
    if (step == 2) job.checkpoint();
  }
  return job.everything();
}

}  // namespace

TEST_CASE(
    "a job placed on more or fewer shards holds every row and value as before and trains on") {
  for (uint32_t to : {3u, 1u, 4u}) {
    CAPTURE(to);
    testing::TempDir old_dir, new_dir;
    std::vector<double> before, trained_on;
    {
      Job job(2, old_dir.path);
      job.train(1);
      job.train(2);
      job.checkpoint();
      before = job.everything();
      job.train(3);
      trained_on = job.everything();
    }
    // The checkpoint after step 2 again: step 3 went into the log, so take it from a copy.
    testing::TempDir at_two;
    {
      Job job(2, at_two.path);
      job.train(1);
      job.train(2);
      job.checkpoint();
    }
    fs::remove_all(new_dir.path);
    const ReshardReport report = reshard(
        {.from = {at_two.path}, .to = new_dir.path, .shards = to, .split_bytes = kSplitBytes});
    CHECK(report.from_shards == 2);
    CHECK(report.map.epoch() == 2);
    CHECK(report.variables == 2);
    CHECK(report.tables == 1);
    CHECK(report.written.size() == to);
    CHECK(report.rows > 0);
    Job placed(to, new_dir.path, /*job=*/99);  // the checkpoint's job and map win
    CHECK(placed.map == SlotMap::even(2).rebalanced(to));
    CHECK(placed.shards[0]->shard.job() == 1);
    CHECK(placed.everything() == before);
    placed.train(3);  // the next step is taken: each part's steps came along
    CHECK(placed.everything() == trained_on);
  }
}

TEST_CASE("updates logged after the checkpoints are replayed into the new shards, old files kept") {
  for (uint32_t to : {3u, 1u}) {
    CAPTURE(to);
    testing::TempDir old_dir, new_dir, reference;
    std::vector<double> on_two;  // the job after step 5 on 2 shards throughout
    {
      Job job(2, reference.path);
      for (uint64_t step = 1; step <= 5; ++step) job.train(step);
      on_two = job.everything();
    }
    const std::vector<double> killed = killed_after(old_dir.path, 4);
    {  // a record cut short at the end of shard 1's log, as a kill mid-append leaves it
      std::ofstream log(newest_log(old_dir.path, 1), std::ios::binary | std::ios::app);
      log << "torn";
    }
    const auto files = contents(old_dir.path);
    const ReshardReport report = reshard({.from = {old_dir.path},
                                          .to = new_dir.path,
                                          .shards = to,
                                          .split_bytes = kSplitBytes,
                                          .replay = job_settings(2)});
    REQUIRE(report.replayed.size() == 2);
    CHECK(report.replayed[0].shard == 0);
    CHECK(report.replayed[0].updates > 0);
    CHECK(report.replayed[1].updates > 0);
    CHECK(report.replayed[0].dropped.empty());
    REQUIRE(report.replayed[1].dropped.size() == 1);
    CHECK(report.replayed[1].dropped[0].starts_with("in a copy: " +
                                                    newest_log(old_dir.path, 1).string()));
    CHECK(report.replayed[1].lost.empty());
    CHECK(contents(old_dir.path) == files);  // the torn record too: only its copy was cut
    CHECK(!fs::exists(new_dir.path / "restored"));
    Job placed(to, new_dir.path);
    CHECK(placed.everything() == killed);
    placed.train(5);
    CHECK(placed.everything() == on_two);
  }
}

TEST_CASE("a damaged log is refused naming the file, or gone past with accept_log_loss") {
  testing::TempDir old_dir, out, at_two;
  fs::remove_all(out.path);
  killed_after(old_dir.path, 4);
  std::vector<double> checkpointed;  // what the job held at its checkpoint, after step 2
  {
    Job job(2, at_two.path);
    job.train(1);
    job.train(2);
    checkpointed = job.everything();
  }
  // A byte of each shard's first logged record changed: its checksum fails, records follow it.
  for (uint32_t shard : {0u, 1u}) {
    std::fstream file(newest_log(old_dir.path, shard),
                      std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(static_cast<std::streamoff>(kLogHeaderBytes + kLogRecordHeaderBytes + 2));
    file.put('\xff');
  }
  const fs::path log = newest_log(old_dir.path, 0);
  const auto files = contents(old_dir.path);
  ReshardOptions options{
      .from = {old_dir.path}, .to = out.path, .shards = 3, .replay = job_settings(2)};
  try {
    reshard(options);
    FAIL("a damaged log was not refused");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::corrupt_checkpoint);
    const std::string why = e.what();
    CHECK(why.starts_with("reshard: shard 0: update log " + log.string() +
                          " is damaged at byte 20 (record fails its checksum)"));
    CHECK(why.find("reshard-partial") == std::string::npos);  // the file, not its copy
  }
  CHECK(!fs::exists(out.path));
  fs::path partial = out.path;
  CHECK(!fs::exists(partial += ".reshard-partial"));
  CHECK(contents(old_dir.path) == files);
  // Past the damage: both shards as their checkpoints held them, steps 3 and 4 lost.
  options.replay->accept_log_loss = true;
  const ReshardReport report = reshard(options);
  REQUIRE(report.replayed.size() == 2);
  CHECK(report.replayed[0].updates == 0);
  CHECK(report.replayed[0].lost.starts_with("shard 0: update log " + log.string() + " is damaged"));
  CHECK(!report.replayed[1].lost.empty());
  CHECK(contents(old_dir.path) == files);
  Job placed(3, out.path);
  CHECK(placed.everything() == checkpointed);
}

TEST_CASE("a worker that pushed only to shard 1 is a member that pushed on every new shard") {
  testing::TempDir old_dir, out;
  fs::remove_all(out.path);
  std::string name = "v";  // a whole variable on shard 1 of 2: shard 0 never sees a push
  while (place_variable(name, 3, 4, SlotMap::even(2), kSplitBytes)[0].shard.value != 1) name += "v";
  {
    Job job(2, old_dir.path, 1, Mode::sync);
    const VariableId id = job.shards[1]->variable(dense_spec(name, 3), {0, 3});
    for (uint64_t step = 1; step <= 2; ++step) {
      std::vector<float> g{1, 2, 3};
      job.shards[1]->push(
          {WorkerId(0), id, Step(step), {0, 3}, DType::float32, testing::bytes_of(g)});
    }
    job.checkpoint();
  }
  reshard({.from = {old_dir.path}, .to = out.path, .shards = 3});
  Job placed(3, out.path, 1, Mode::sync);
  // A trainer process that starts again joins where the shards say, the latest step any names
  // (client/worker.h): the job's next one, not its first.
  Step from;
  for (auto& shard : placed.shards) {
    std::optional<Result<Step>> answer;
    shard->shard.join(WorkerId(0), Step(1), [&](const Result<Step>& r) { answer = r; });
    placed.io.drain();
    REQUIRE(answer);
    REQUIRE(*answer);
    from = std::max(from, **answer);
  }
  CHECK(from == Step(3));
}

TEST_CASE("a set with a shard missing, from two jobs, or with logged updates is refused") {
  testing::TempDir a, b, out;
  fs::remove_all(out.path);
  for (auto [dir, job_id] : {std::pair{a.path, 1}, std::pair{b.path, 2}}) {
    Job job(2, dir, job_id);
    job.train(1);
    job.checkpoint();
  }
  const ReshardOptions options{.from = {a.path}, .to = out.path, .shards = 3};
  SUBCASE("a shard missing") {
    for (const auto& entry : fs::directory_iterator(a.path))
      if (entry.path().filename().string().starts_with("shard-1.")) fs::remove(entry.path());
    CHECK(refusal(options) ==
          "reshard: the set is incomplete: the job ran on 2 shards and shard 1 has no checkpoint "
          "in the directories given");
  }
  SUBCASE("two jobs") {
    for (const auto& entry : fs::directory_iterator(a.path))
      if (entry.path().filename().string().starts_with("shard-1.")) fs::remove(entry.path());
    for (const auto& entry : fs::directory_iterator(b.path))
      if (entry.path().filename().string().starts_with("shard-0.")) fs::remove(entry.path());
    const std::string why = refusal({.from = {a.path, b.path}, .to = out.path, .shards = 3});
    CHECK(why.find("are not of one job: job 0000000000000001") != std::string::npos);
    CHECK(why.find("and job 0000000000000002") != std::string::npos);
  }
  SUBCASE("one shard twice") {
    CHECK(refusal({.from = {a.path, b.path}, .to = out.path, .shards = 3})
              .starts_with("reshard: shard 0 has checkpoints in both"));
  }
  SUBCASE("updates logged after the checkpoint, with no deployment to replay them under") {
    {
      Job job(2, a.path, 1);
      job.train(2);
    }
    const std::string why = refusal(options);
    CHECK(why.starts_with("reshard: shard 0 in " + a.path.string() + ": " +
                          newest_log(a.path, 0).string() + " holds "));
    CHECK(why.find("update(s) logged after checkpoint") != std::string::npos);
    CHECK(why.find("give the job's deployment file (psched reshard --from-config FILE") !=
          std::string::npos);
  }
  SUBCASE("replay settings of another deployment") {
    ShardSettings sync = job_settings(2);
    sync.mode = Mode::sync;
    const std::string why = refusal({.from = {a.path},
                                     .to = out.path,
                                     .shards = 3,
                                     .replay = sync,
                                     .replay_source = "--from-config other.yaml"});
    CHECK(
        why.starts_with("reshard: --from-config other.yaml runs sync mode with 1 workers on 2 "
                        "shards, and "));
    CHECK(why.find("holds shard 0 of a job in async mode with 1 workers on 2 shards") !=
          std::string::npos);
  }
  SUBCASE("no shards") {
    CHECK(refusal({.from = {a.path}, .to = out.path, .shards = 0}) ==
          "reshard: --shards 0: a job runs on 1 to 4096 shards");
  }
  SUBCASE("a directory that holds no checkpoint") {
    testing::TempDir empty;
    fs::create_directories(empty.path);
    std::ofstream(empty.path / "notes.txt") << "not a checkpoint\n";
    CHECK(refusal({.from = {a.path, empty.path}, .to = out.path, .shards = 3}) ==
          fmt::format("reshard: {} holds no shard checkpoint (no shard-<id>.<generation>.ckpt "
                      "file): name the job's checkpoint directory",
                      empty.path.string()));
  }
  SUBCASE("a file for a directory") {
    CHECK(refusal({.from = {newest_log(a.path, 0)}, .to = out.path, .shards = 3}) ==
          fmt::format("reshard: {} is no directory", newest_log(a.path, 0).string()));
  }
  SUBCASE("a directory that exists") {
    fs::create_directories(out.path);
    CHECK(refusal(options) ==
          fmt::format("reshard: {} exists; name a new directory for the new shards",
                      out.path.string()));
    fs::remove_all(out.path);
  }
  CHECK(!fs::exists(out.path));
  fs::path partial = out.path;
  CHECK(!fs::exists(partial += ".reshard-partial"));
}

TEST_CASE("a bounded table's rows go to their new shards within max_rows, the excess evicted") {
  testing::TempDir old_dir, one, three;
  uint64_t rows = 0;
  {
    Job job(2, old_dir.path);
    job.table = table_spec(/*max_rows=*/30, /*admit_after=*/2);
    for (uint64_t step = 1; step <= 3; ++step) job.train(step);
    job.checkpoint();
  }
  for (const auto& target : {std::pair{one.path, 1u}, std::pair{three.path, 3u}}) {
    const fs::path& dir = target.first;
    const uint32_t to = target.second;
    CAPTURE(to);
    const ReshardReport report =
        reshard({.from = {old_dir.path}, .to = dir, .shards = to, .split_bytes = kSplitBytes});
    rows = report.rows;
    CHECK(rows == 60);  // both old shards at max_rows
    // One new shard keeps the 30 most recent of the 60; three hold them all (about 20 each).
    CHECK(report.rows_evicted == (to == 1 ? 30 : 0));
    Job placed(to, dir);  // the capacities load: each order lists its rows, within max_rows
    placed.table = table_spec(30, 2);
    placed.train(4);
  }
}
