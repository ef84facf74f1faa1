// SPDX-License-Identifier: Apache-2.0
// Embedding tables hosted by a whole VariableShard: registered beside variables in one id space,
// stepped by its StepMachine (sync means over the members, waits, duplicates), refused whole on
// bad input, and restored after a restart bit for bit.
#include <chrono>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "actors/durability/shard_durability.h"
#include "actors/durability/temp_dir.h"
#include "actors/runtime/test_loop.h"
#include "actors/shard/row_table.h"
#include "actors/shard/shard_test_support.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"

using namespace psched;
using psched::testing::Receipted;

namespace {

// What a pull of rows answered, once it has.
struct Rows {
  std::optional<std::vector<double>> value;
  Step step;
  std::optional<Error> refusal;
  int answers = 0;

  bool done() const { return answers > 0; }
  VariableShard::ValueReply reply() {
    return [this](const Result<FreshValue>& answer) {
      ++answers;
      if (!answer) return void(refusal = answer.error());
      value.emplace(answer->bytes() / sizeof(double));
      answer->read_into(std::as_writable_bytes(std::span(*value)));
      step = answer->step();
    };
  }
};

TableSpec sgd_table(std::string name, uint32_t dim = 2) {
  TableSpec spec{
      .name = std::move(name), .num_embeddings = 100, .dim = dim, .dtype = DType::float64};
  spec.optimizer.lr = 0.5;
  spec.init = {RowInit::Kind::uniform, -1, 1};
  spec.seed = 7;
  return spec;
}

// One shard on a loop; with a directory, its checkpoints and log live there.
struct TableShard {
  testing::TestLoop io;
  VariableShard shard;
  std::vector<std::vector<uint64_t>> kept_ids;  // borrowed by pulls until they answer

  explicit TableShard(Mode mode, std::filesystem::path dir = {}, uint32_t workers = 2,
                      StepConfig steps = {}, uint64_t max_table_bytes = 0,
                      std::vector<TableConfig> tables = {})
      : shard(io.actors, ShardSettings{ShardId(0), mode, workers, 16, std::move(dir), true, steps,
                                       false, max_table_bytes, std::move(tables)}) {}

  void drain() { io.drain(); }
  RestoreReport restore() { return testing::restored(io, shard); }
  void checkpoint() { testing::checkpointed(io, shard); }
  Result<VariableShard::Registration> add(TableSpec spec) {
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_table(std::move(spec),
                         [&](const Result<VariableShard::Registration>& r) { registered = r; });
    drain();
    REQUIRE(registered);
    return *registered;
  }
  VariableId table(TableSpec spec) {
    auto registered = add(std::move(spec));
    if (!registered) throw registered.error();
    return registered->id;
  }
  Receipted push(uint32_t worker, VariableId table, uint64_t step, std::vector<uint64_t> ids,
                 std::vector<double> gradients) {
    Receipted receipt;
    shard.push({.worker = WorkerId(worker),
                .variable = table,
                .step = Step(step),
                .dtype = DType::float64,
                .data = std::as_bytes(std::span(gradients)),
                .rows = true,
                .ids = ids},
               receipt.reply());
    drain();
    return receipt;
  }
  // Files a pull of `ids` for `step` (its reply runs as the loop drains).
  void pull(Rows& rows, uint32_t worker, VariableId table, uint64_t step,
            std::vector<uint64_t> ids) {
    kept_ids.push_back(std::move(ids));
    shard.poll({WorkerId(worker),
                table,
                Step(step),
                {},
                PollTicket(kept_ids.size()),
                true,
                kept_ids.back()},
               rows.reply());
    drain();
  }
  std::vector<double> rows(VariableId table, std::vector<uint64_t> ids, uint64_t step = 0) {
    Rows rows;
    pull(rows, 0, table, step, std::move(ids));
    REQUIRE(rows.value);
    return *rows.value;
  }
};

}  // namespace

TEST_CASE("a table's first rows are its seed's, the same on any shard and in any order") {
  std::vector<double> first;
  {
    TableShard a(Mode::sync);
    const VariableId t = a.table(sgd_table("t"));
    first = a.rows(t, {3, 50});
    CHECK(a.table(sgd_table("t")) == t);  // the same spec again: a no-op
  }
  TableShard b(Mode::async);
  b.table(sgd_table("other"));
  const VariableId t = b.table(sgd_table("t"));
  CHECK(b.rows(t, {50, 3, 50}) ==
        std::vector<double>{first[2], first[3], first[0], first[1], first[2], first[3]});
  CHECK(first[0] != first[2]);
  for (double x : first) CHECK((x >= -1 && x < 1));
}

TEST_CASE("sync: a row gets the mean of the members' summed gradients once every member pushed") {
  TableShard f(Mode::sync);
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {1, 2});
  // Worker 0 touches row 1 twice (its gradients sum), worker 1 rows 1 and 2.
  CHECK(f.push(0, t, 1, {1, 1}, {1, 2, 3, 4}).taken());
  Rows waiting;
  f.pull(waiting, 0, t, 1, {1, 2});
  CHECK_FALSE(waiting.done());  // step 1 waits for worker 1
  CHECK(f.push(1, t, 1, {2, 1}, {10, 20, 2, 2}).taken());
  REQUIRE(waiting.value);
  CHECK(waiting.step == Step(1));
  const std::vector<double> expected{w0[0] - 0.5 * (4 + 2) / 2, w0[1] - 0.5 * (6 + 2) / 2,
                                     w0[2] - 0.5 * (0 + 10) / 2, w0[3] - 0.5 * (0 + 20) / 2};
  CHECK(*waiting.value == expected);
}

TEST_CASE("sync: a worker that touched no row pushes its step empty, and the step closes") {
  TableShard f(Mode::sync);
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {4});
  CHECK(f.push(0, t, 1, {}, {}).taken());
  CHECK(f.push(1, t, 1, {4}, {2, 2}).taken());
  CHECK(f.rows(t, {4}, 1) == std::vector<double>{w0[0] - 0.5, w0[1] - 0.5});
  CHECK(f.push(0, t, 2, {}, {}).taken());  // step 2 is open now
}

TEST_CASE("a resent push is acknowledged and not applied twice") {
  TableShard f(Mode::async);
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {9});
  CHECK(f.push(0, t, 1, {9}, {1, 1}).taken());
  CHECK(f.push(0, t, 1, {9}, {1, 1}).taken());
  CHECK(f.rows(t, {9}) == std::vector<double>{w0[0] - 0.5, w0[1] - 0.5});
}

TEST_CASE("bad input names table, id or width, and nothing of the push is applied") {
  TableShard f(Mode::async);
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {1});
  Receipted past = f.push(0, t, 1, {1, 100}, {1, 1, 1, 1});
  REQUIRE(past.refusal);
  CHECK(past.refusal->code() == ErrorCode::offset_out_of_range);
  CHECK(std::string(past.refusal->what()).find("table 't'") != std::string::npos);
  CHECK(std::string(past.refusal->what()).find("id 100") != std::string::npos);
  Receipted narrow = f.push(0, t, 1, {1}, {1, 1, 1});
  REQUIRE(narrow.refusal);
  CHECK(narrow.refusal->code() == ErrorCode::shape_mismatch);
  CHECK(f.rows(t, {1}) == w0);
  CHECK(f.push(0, t, 1, {1}, {1, 1}).taken());  // step 1 is still the next one

  TableSpec other = sgd_table("t", 3);
  CHECK(f.add(other).error().code() == ErrorCode::spec_conflict);
  other = sgd_table("t");
  other.optimizer.kind = optim::RowOptimizerKind::adagrad;
  CHECK(f.add(other).error().code() == ErrorCode::spec_conflict);
  Rows beyond;
  f.pull(beyond, 0, t, 0, {100});
  REQUIRE(beyond.refusal);
  CHECK(beyond.refusal->code() == ErrorCode::offset_out_of_range);
  Receipted unknown = f.push(0, VariableId(5), 1, {}, {});
  REQUIRE(unknown.refusal);
  CHECK(unknown.refusal->code() == ErrorCode::unknown_variable);
}

TEST_CASE("tables and variables share the shard's ids and names") {
  TableShard f(Mode::async);
  VariableSpec spec{.name = "w", .shape = {2}};
  std::vector<float> init{1, 2};
  std::optional<Result<VariableShard::Registration>> dense;
  f.shard.register_variable(spec, {0, 2}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { dense = r; });
  f.drain();
  REQUIRE((dense && *dense));
  const VariableId t = f.table(sgd_table("t"));
  CHECK((*dense)->id == VariableId(0));
  CHECK(t == VariableId(1));
  CHECK(f.add(sgd_table("w")).error().code() == ErrorCode::spec_conflict);
  Receipted wrong_kind = f.push(0, VariableId(0), 1, {}, {});
  REQUIRE(wrong_kind.refusal);
  CHECK(wrong_kind.refusal->code() == ErrorCode::unknown_variable);
}

TEST_CASE("async: a worker's pull waits for its own push only") {
  TableShard f(Mode::async);
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {2});
  Rows waiting;
  f.pull(waiting, 0, t, 1, {2});
  CHECK_FALSE(waiting.done());
  CHECK(f.push(0, t, 1, {2}, {2, 2}).taken());  // applied at once, no mean
  REQUIRE(waiting.value);
  CHECK(*waiting.value == std::vector<double>{w0[0] - 1, w0[1] - 1});
}

TEST_CASE("bounded: a pull is held until every member pushed its step - staleness") {
  TableShard f(Mode::bounded, {}, 2, StepConfig{.staleness = 1});
  const VariableId t = f.table(sgd_table("t"));
  CHECK(f.push(0, t, 1, {3}, {1, 1}).taken());
  CHECK(f.push(0, t, 2, {3}, {1, 1}).taken());
  Rows held;
  f.pull(held, 0, t, 2, {3});
  CHECK_FALSE(held.done());  // worker 1 has not pushed step 1
  CHECK(f.push(1, t, 1, {}, {}).taken());
  REQUIRE(held.value);
  CHECK(held.step == Step(2));
}

TEST_CASE("sync: a step past its timeout proceeds with the mean of the workers that pushed") {
  TableShard f(Mode::sync, {}, 3, StepConfig{10, TimeoutAction::proceed});
  const VariableId t = f.table(sgd_table("t"));
  const std::vector<double> w0 = f.rows(t, {5});
  CHECK(f.push(0, t, 1, {5}, {1, 1}).taken());
  CHECK(f.push(1, t, 1, {}, {}).taken());
  Rows waiting;
  f.pull(waiting, 0, t, 1, {5});
  CHECK_FALSE(waiting.done());
  f.shard.enforce_deadlines(std::chrono::steady_clock::now() + std::chrono::seconds(11));
  f.drain();
  REQUIRE(waiting.value);  // the mean over the two that pushed: worker 1 counts as zero
  CHECK(*waiting.value == std::vector<double>{w0[0] - 0.25, w0[1] - 0.25});
  CHECK(f.push(2, t, 1, {5}, {9, 9}).taken());  // late: acknowledged and dropped
  CHECK(f.rows(t, {5}) == *waiting.value);
}

TEST_CASE("a restarted shard holds every acknowledged row update bit for bit, and goes on") {
  testing::TempDir dir;
  TableSpec spec = sgd_table("t", 3);
  spec.optimizer = optim::torch_row_defaults(optim::RowOptimizerKind::sparse_adam);
  std::vector<double> before;
  {
    TableShard life(Mode::sync, dir.path);
    life.restore();
    const VariableId t = life.table(spec);
    for (uint64_t step = 1; step <= 3; ++step) {
      CHECK(life.push(0, t, step, {1, 7}, {0.1, 0.2, 0.3, -0.4, 0.5, 0.6}).taken());
      if (step == 2) life.checkpoint();  // mid-step: the rest comes from the log
      CHECK(life.push(1, t, step, {7}, {1, 1, 1}).taken());
    }
    CHECK(life.push(0, t, 4, {1}, {1, 1, 1}).taken());  // step 4 half pushed: in its sums
    before = life.rows(t, {1, 7, 8}, 3);
  }
  TableShard again(Mode::sync, dir.path);
  RestoreReport report = again.restore();
  CHECK(report.variables == 0);
  const VariableId t = again.table(spec);  // registering again is a no-op
  CHECK(again.rows(t, {1, 7, 8}, 3) == before);
  CHECK(again.push(1, t, 4, {1}, {1, 1, 1}).taken());
  const std::vector<double> after = again.rows(t, {1}, 4);
  CHECK(after != std::vector<double>(before.begin(), before.begin() + 3));
}

namespace {

// A table of 100,000 rows of one element, and the ids of more rows of it than a checkpoint
// lets wait for its writer at once: some of them are encoded only after later pushes came.
TableSpec large_table() {
  TableSpec spec = sgd_table("t", 1);
  spec.num_embeddings = 100'000;
  return spec;
}
std::vector<uint64_t> stored_ids() {
  std::vector<uint64_t> ids((ShardDurability::kChunksInFlight + 2) * RowTable::kRowsPerChunk);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = k;
  return ids;
}

}  // namespace

TEST_CASE("a checkpoint streams a table while pushes change it, and a restart holds each once") {
  testing::TempDir dir;
  const TableSpec spec = large_table();
  const std::vector<uint64_t> ids = stored_ids();  // the pushes below change rows of them
  std::vector<double> before;
  {
    TableShard life(Mode::async, dir.path, 1);
    life.restore();
    const VariableId t = life.table(spec);
    CHECK(life.push(0, t, 1, ids, std::vector<double>(ids.size(), 1)).taken());
    std::exception_ptr error;
    std::filesystem::path file;
    auto written = kj::newPromiseAndFulfiller<void>();
    life.shard.checkpoint([&](std::exception_ptr e, std::filesystem::path f) {
      error = e;
      file = std::move(f);
      written.fulfiller->fulfill();
    });
    // Step 2 before the stream is through: the last rows, the first, one new row.
    CHECK(life.push(0, t, 2, {ids.back(), 0, 99'999}, {4, 4, 4}).taken());
    life.io.wait(kj::mv(written.promise));
    if (error) std::rethrow_exception(error);
    CHECK(file.filename() == "shard-0.00000002.ckpt");
    before = life.rows(t, {0, 1, ids.back(), 99'999}, 2);
  }  // killed: step 2 is in the log only
  TableShard again(Mode::async, dir.path, 1);
  RestoreReport report = again.restore();
  CHECK(report.replayed == 1);
  CHECK(report.tables == 1);
  const VariableId t = again.table(spec);
  CHECK(again.rows(t, {0, 1, ids.back(), 99'999}, 2) == before);
}

TEST_CASE("checkpoints asked for while one streams are taken after it, in order") {
  testing::TempDir dir;
  const std::vector<uint64_t> ids = stored_ids();
  TableShard life(Mode::async, dir.path, 1);
  life.restore();
  const VariableId t = life.table(large_table());
  CHECK(life.push(0, t, 1, ids, std::vector<double>(ids.size(), 1)).taken());
  std::vector<std::string> files;
  auto all = kj::newPromiseAndFulfiller<void>();
  for (int k = 0; k < 3; ++k)
    life.shard.checkpoint([&](std::exception_ptr e, std::filesystem::path f) {
      CHECK_FALSE(e);
      files.push_back(f.filename().string());
      if (files.size() == 3) all.fulfiller->fulfill();
    });
  life.io.wait(kj::mv(all.promise));
  CHECK(files == std::vector<std::string>{"shard-0.00000002.ckpt", "shard-0.00000003.ckpt",
                                          "shard-0.00000004.ckpt"});
}

TEST_CASE("a bounded table restarts to the same rows, evictions and admissions replayed") {
  testing::TempDir dir;
  TableSpec spec = sgd_table("t", 2);
  spec.max_rows = 4;
  spec.admit_after = 2;
  auto pushes = [](TableShard& life, VariableId t, uint64_t from, uint64_t to) {
    for (uint64_t step = from; step <= to; ++step)
      for (uint32_t w = 0; w < 2; ++w)
        CHECK(life.push(w, t, step, {step % 5 + w, (step * 3) % 9 + 10},
                        {0.1 * double(step), 0.2, -0.3, 0.4})
                  .taken());
  };
  std::vector<uint64_t> all(20);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> before;
  {
    TableShard life(Mode::sync, dir.path);
    life.restore();
    const VariableId t = life.table(spec);
    pushes(life, t, 1, 6);
    life.checkpoint();
    pushes(life, t, 7, 12);  // after the checkpoint: from the log
    before = life.rows(t, all, 12);
    ShardStats stats;
    life.shard.stats([&](ShardStats s) { stats = std::move(s); });
    life.drain();
    REQUIRE(stats.table_stats.size() == 1);
    CHECK(stats.table_stats[0].rows == 4);
    CHECK(stats.table_stats[0].rows_evicted > 0);
    CHECK(stats.table_stats[0].updates_dropped > 0);
  }
  TableShard again(Mode::sync, dir.path);
  again.restore();
  const VariableId t = again.table(spec);
  CHECK(again.rows(t, all, 12) == before);
}

TEST_CASE("limits.max_table_bytes refuses a push of new rows past it, naming table and limit") {
  TableSpec spec = sgd_table("t", 2);
  spec.num_embeddings = 1'000'000;
  TableShard life(Mode::async, {}, 1, {}, 2 << 20);  // about 2 chunks of rows of Adagrad-free sgd
  const VariableId t = life.table(spec);
  std::vector<uint64_t> ids(RowTable::kRowsPerChunk);
  std::iota(ids.begin(), ids.end(), 0);
  CHECK(life.push(0, t, 1, ids, std::vector<double>(2 * ids.size(), 1.0)).taken());
  const std::vector<double> first = life.rows(t, {0, 5000});
  std::vector<uint64_t> more(40 * RowTable::kRowsPerChunk);
  std::iota(more.begin(), more.end(), 100'000);
  Receipted refused = life.push(0, t, 2, more, std::vector<double>(2 * more.size(), 1.0));
  REQUIRE(refused.refusal);
  CHECK(refused.refusal->code() == ErrorCode::overloaded);
  const std::string what = refused.refusal->what();
  CHECK(what.find("table 't'") != std::string::npos);
  CHECK(what.find("limits.max_table_bytes (2097152)") != std::string::npos);
  CHECK(life.rows(t, {0, 5000}) == first);                  // nothing of it applied
  CHECK(life.push(0, t, 2, {1, 2}, {1, 1, 1, 1}).taken());  // stored rows go on
}

TEST_CASE("the deployment's tables: entry bounds a registration, and refuses one that differs") {
  TableConfig declared{.name = "t",
                       .max_rows = 3,
                       .admit_after = 2,
                       .dim = 2,
                       .optimizer = "sgd",
                       .init = "uniform",
                       .init_values = {-1, 1}};
  TableShard life(Mode::async, {}, 1, {}, 0, {declared});
  const VariableId t = life.table(sgd_table("t", 2));
  for (uint64_t step = 1; step <= 4; ++step)
    CHECK(life.push(0, t, step, {step, step + 1, step + 2, step + 3}, std::vector<double>(8, 1.0))
              .taken());
  ShardStats stats;
  life.shard.stats([&](ShardStats s) { stats = std::move(s); });
  life.drain();
  CHECK(stats.table_stats.at(0).max_rows == 3);
  CHECK(stats.table_stats.at(0).rows == 3);
  auto wide = life.add(sgd_table("t", 3));
  REQUIRE_FALSE(wide);
  CHECK(wide.error().code() == ErrorCode::spec_conflict);
  CHECK(std::string(wide.error().what()).find("dim 3 but the deployment's tables: entry says 2") !=
        std::string::npos);
}
