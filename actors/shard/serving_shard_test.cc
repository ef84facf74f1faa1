// SPDX-License-Identifier: Apache-2.0
// Serving shards (VariableShard::serve, ::reload): a trained job's checkpoints answered
// read-only, a newer one loaded beside and switched to under the same ids, and what a version
// that cannot take the served one's place is refused for.
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "actors/durability/temp_dir.h"
#include "actors/shard/shard_test_support.h"

using namespace psched;
using psched::testing::Answered;
using psched::testing::Receipted;

namespace {

TableSpec table_spec() {
  TableSpec spec{.name = "emb", .num_embeddings = 1000, .dim = 2, .dtype = DType::float32};
  spec.optimizer.lr = 0.5;
  spec.init = {RowInit::Kind::uniform, -1, 1};
  spec.seed = 3;
  return spec;
}

// One shard on the test's loop (a thread has one): a trainer's on `dir`, or (serving) one that
// serves `dir`.
struct Life {
  testing::TestLoop& io;
  VariableShard shard;
  std::filesystem::path dir;
  std::vector<std::vector<uint64_t>> kept_ids;  // borrowed by pulls until they answer

  Life(testing::TestLoop& loop, const std::filesystem::path& dir, bool serving, uint64_t job = 5)
      : io(loop), shard(loop.actors, settings(dir, serving, job)), dir(dir) {}

  static ShardSettings settings(const std::filesystem::path& dir, bool serving, uint64_t job) {
    ShardSettings s{.id = ShardId(0), .workers = 1};
    s.job = job;
    (serving ? s.serve_directory : s.checkpoint_directory) = dir;
    return s;
  }

  void train_start() { testing::restored(io, shard); }
  std::filesystem::path checkpoint() { return testing::checkpointed(io, shard); }

  ServedVersion serve() {
    std::exception_ptr error;
    ServedVersion version;
    shard.serve(ShardDurability::newest_served(settings(dir, true, 0)),
                [&](std::exception_ptr e, ServedVersion v) {
                  error = e;
                  version = std::move(v);
                });
    io.drain();
    if (error) std::rethrow_exception(error);
    return version;
  }
  // reload(), waited for (the load runs on a thread of its own).
  std::optional<ServedVersion> reload() {
    return testing::waited<std::optional<ServedVersion>>(io,
                                                         [&](auto reply) { shard.reload(reply); });
  }

  Result<VariableShard::Registration> add_variable(const std::string& name,
                                                   std::vector<float> init) {
    VariableSpec spec{.name = name, .shape = {init.size()}};
    spec.optimizer.lr = 0.5;
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](const auto& r) { registered = r; });
    io.drain();
    REQUIRE(registered);
    return *registered;
  }
  Result<VariableShard::Registration> add_table() {
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_table(table_spec(), [&](const auto& r) { registered = r; });
    io.drain();
    REQUIRE(registered);
    return *registered;
  }
  Receipted push(VariableId id, uint64_t step, std::vector<float> g) {
    Receipted receipt;
    shard.push({WorkerId(0), id, Step(step), {0, g.size()}, DType::float32, testing::bytes_of(g)},
               receipt.reply());
    io.drain();
    return receipt;
  }
  Receipted push_rows(VariableId table, uint64_t step, std::vector<uint64_t> ids,
                      std::vector<float> g) {
    Receipted receipt;
    shard.push({.worker = WorkerId(0),
                .variable = table,
                .step = Step(step),
                .dtype = DType::float32,
                .data = testing::bytes_of(g),
                .rows = true,
                .ids = ids},
               receipt.reply());
    io.drain();
    return receipt;
  }
  // A poll of the whole of variable `id` (`n` elements) for `step`, as a worker asks.
  Answered poll(VariableId id, uint64_t n, uint64_t step) {
    Answered answered;
    shard.poll({WorkerId(0), id, Step(step), {0, n}, PollTicket(1)}, answered.reply());
    io.drain();
    return answered;
  }
  std::vector<float> rows(VariableId table, std::vector<uint64_t> ids, uint64_t step = 0) {
    kept_ids.push_back(std::move(ids));
    Answered answered;
    shard.poll({WorkerId(0), table, Step(step), {}, PollTicket(2), true, kept_ids.back()},
               answered.reply());
    io.drain();
    REQUIRE(answered.value);
    return *answered.value;
  }
  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = std::move(s); });
    io.drain();
    return out;
  }
};

// A job on `dir`: variable w and table emb trained `steps` steps, then checkpointed.
struct Trained {
  std::vector<float> w;
  std::vector<float> rows;  // of ids 4 and 700
};
Trained train(Life& job, int from, int to) {
  const VariableId w = job.add_variable("w", {1, 2, 3})->id;
  const VariableId emb = job.add_table()->id;
  for (int s = from; s <= to; ++s) {
    REQUIRE(job.push(w, s, {0.1f * s, -0.2f, 0.3f}).taken());
    REQUIRE(job.push_rows(emb, s, {4, 700}, {1, 2, 3, 4}).taken());
  }
  job.checkpoint();
  return {*job.poll(w, 3, 0).value, job.rows(emb, {4, 700})};
}

}  // namespace

TEST_CASE("a serving shard answers what the job's checkpoint holds and refuses every push") {
  testing::TestLoop io;
  testing::TempDir dir;
  Trained trained;
  {
    Life job(io, dir.path, false);
    job.train_start();
    trained = train(job, 1, 3);
  }
  Life serving(io, dir.path, true);
  const ServedVersion version = serving.serve();
  CHECK(version.generation == 2);  // the empty one at the job's start, then the trained one
  CHECK(version.step == 3);
  // Inference clients register as trainers do: the same spec is the usual no-op.
  const VariableId w = serving.add_variable("w", {0, 0, 0})->id;
  const VariableId emb = serving.add_table()->id;
  CHECK(*serving.poll(w, 3, 0).value == trained.w);
  CHECK(serving.rows(emb, {4, 700}) == trained.rows);
  // No step comes to a serving shard: a poll for any step is answered at once.
  Answered later = serving.poll(w, 3, 100);
  REQUIRE(later.value);
  CHECK(later.step == Step(3));

  Receipted pushed = serving.push(w, 4, {1, 1, 1});
  REQUIRE(pushed.refusal);
  CHECK(pushed.refusal->code() == ErrorCode::read_only);
  CHECK(std::string(pushed.refusal->what()).find("push to 'w' refused: shard 0 serves") !=
        std::string::npos);
  Receipted rows = serving.push_rows(emb, 4, {4}, {9, 9});
  REQUIRE(rows.refusal);
  CHECK(rows.refusal->code() == ErrorCode::read_only);
  auto unknown = serving.add_variable("new", {0});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == ErrorCode::read_only);
  // Refused pushes changed nothing.
  CHECK(*serving.poll(w, 3, 0).value == trained.w);
  CHECK(serving.rows(emb, {4, 700}) == trained.rows);

  const ShardStats stats = serving.stats();
  REQUIRE(stats.served);
  CHECK(stats.served->checkpoint == version.checkpoint);
  CHECK(stats.versions_loaded == 1);
  CHECK(stats.errors[static_cast<size_t>(ErrorCode::read_only)] == 3);
}

TEST_CASE("a reload takes the newer checkpoint under the same ids, and nothing when none is") {
  testing::TestLoop io;
  testing::TempDir dir;
  Life job(io, dir.path, false);
  job.train_start();
  train(job, 1, 2);

  std::optional<Trained> later;
  Life serving(io, dir.path, true);
  serving.serve();
  const VariableId w = serving.add_variable("w", {0, 0, 0})->id;
  const VariableId emb = serving.add_table()->id;
  CHECK_FALSE(serving.reload().has_value());  // nothing newer

  // The job trains on, with a variable that is new, and checkpoints again.
  REQUIRE(job.add_variable("bias", {7})->created);
  later = train(job, 3, 5);
  std::optional<ServedVersion> next = serving.reload();
  REQUIRE(next);
  CHECK(next->generation == 3);
  CHECK(next->step == 5);
  CHECK(*serving.poll(w, 3, 0).value == later->w);
  CHECK(serving.rows(emb, {4, 700}) == later->rows);
  const auto bias = serving.add_variable("bias", {0});
  REQUIRE(bias);
  CHECK_FALSE(bias->created);
  CHECK(*serving.poll(bias->id, 1, 0).value == std::vector<float>{7});
  CHECK(serving.stats().versions_loaded == 2);
}

TEST_CASE("a version that cannot take the served one's place is refused, and it serves on") {
  testing::TestLoop io;
  testing::TempDir served, other;
  Trained trained;
  {
    Life job(io, served.path, false);
    job.train_start();
    trained = train(job, 1, 2);
  }
  Life serving(io, served.path, true);
  serving.serve();
  const VariableId w = serving.add_variable("w", {0, 0, 0})->id;

  // Another job's newer checkpoint lands in the served directory.
  std::filesystem::path foreign;
  {
    Life job(io, other.path, false, /*job=*/6);
    job.train_start();
    train(job, 1, 1);
    job.checkpoint();
    foreign = job.checkpoint();  // generation 4, above the served 2
  }
  std::filesystem::copy_file(foreign, served.path / foreign.filename());
  try {
    serving.reload();
    FAIL("the reload was not refused");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    CHECK(std::string(e.what()).find("is of job 0000000000000006") != std::string::npos);
  }
  CHECK(*serving.poll(w, 3, 0).value == trained.w);
  const ShardStats stats = serving.stats();
  CHECK(stats.reloads_refused == 1);
  CHECK(stats.served->generation == 2);

  // The same job's, without what it serves.
  std::filesystem::remove(served.path / foreign.filename());
  {
    testing::TempDir bare;
    Life job(io, bare.path, false);
    job.train_start();
    for (int i = 0; i < 4; ++i) foreign = job.checkpoint();  // generation 5, holding nothing
    std::filesystem::copy_file(foreign, served.path / foreign.filename());
  }
  try {
    serving.reload();
    FAIL("the reload was not refused");
  } catch (const Error& e) {
    INFO(std::string(e.what()));
    CHECK(std::string(e.what()).find("holds no 'w', which it serves") != std::string::npos);
  }
  CHECK(*serving.poll(w, 3, 0).value == trained.w);
}

TEST_CASE(
    "a serving shard refuses to start on a directory with no checkpoint of its own, naming an "
    "export") {
  testing::TestLoop io;
  testing::TempDir dir;
  Life serving(io, dir.path / "missing", true);
  CHECK_THROWS_WITH_AS(serving.serve(), doctest::Contains("no such directory"), Error);
  std::filesystem::create_directories(dir.path);
  Life empty(io, dir.path, true);
  CHECK_THROWS_WITH_AS(empty.serve(), doctest::Contains("no valid checkpoint of shard 0"), Error);
  std::ofstream(dir.path / "manifest.json") << "{}";  // an export folder
  Life exported(io, dir.path, true);
  CHECK_THROWS_WITH_AS(exported.serve(),
                       doctest::Contains("an export folder, not checkpoints; make it the "
                                         "checkpoints of this deployment's shards first (psched "
                                         "import --from"),
                       Error);
}
