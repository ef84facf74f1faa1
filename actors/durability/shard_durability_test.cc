// SPDX-License-Identifier: Apache-2.0
// ShardDurability on its own, against a recording State: what it logs, what a restart hands
// back and in which order. Whole shards restarted from their files:
// actors/durability/shard_store_test.cc.
#include "actors/durability/shard_durability.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "actors/durability/temp_dir.h"
#include "actors/runtime/test_loop.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"
#include "common/kj_error.h"

using namespace psched;

namespace {

// Saves one number as its "variables" and writes down every call it gets, in order.
struct RecordingState final : ShardDurability::State {
  uint64_t value = 0;
  std::vector<std::string> calls;

  void save_variables(ByteWriter& out) const override { out.put(value); }
  uint64_t freeze_rows(ShardDurability::RowsEmit) override { return 0; }
  bool save_rows() override { return false; }
  void load_variables(ByteReader& in, ByteSource&) override {
    value = in.get<uint64_t>();
    calls.push_back(fmt::format("load {}", value));
  }
  void replay_register(VariableSpec& spec, ElementRange part,
                       std::span<const std::byte> initial) override {
    calls.push_back(fmt::format("register {} [{}, {}) {} bytes", spec.name, part.begin, part.end,
                                initial.size()));
  }
  void replay_push(const Push& p) override {
    if (p.rows)
      return calls.push_back(fmt::format("rows w{} t{} s{} ids {} {} bytes", p.worker.value,
                                         p.variable.value, p.step, fmt::join(p.ids, ","),
                                         p.data.size()));
    calls.push_back(fmt::format("push w{} v{} s{} [{}, {}) {} bytes{}", p.worker.value,
                                p.variable.value, p.step, p.range.begin, p.range.end, p.data.size(),
                                p.gradient == PushedGradient::sparse ? " sparse" : ""));
  }
  void replay_register_table(TableSpec& spec) override {
    calls.push_back(
        fmt::format("table {} {}x{}{}", spec.name, spec.num_embeddings, spec.dim,
                    spec.max_rows || spec.admit_after
                        ? fmt::format(" max {} admit {}", spec.max_rows, spec.admit_after)
                        : ""));
  }
  void replay_timeout(VariableId id, Step step, const std::string&) override {
    calls.push_back(fmt::format("timeout v{} s{}", id.value, step));
  }
  void replay_join(WorkerId worker, Step from, const std::string&) override {
    calls.push_back(fmt::format("join w{} s{}", worker.value, from));
  }
  void replay_leave(WorkerId worker, const std::string&) override {
    calls.push_back(fmt::format("leave w{}", worker.value));
  }
};

// One process's life on a directory: a loop, a state and its durability.
struct Life {
  testing::TestLoop io;
  ShardSettings settings;
  RecordingState state;
  ShardDurability durability{io.actors, settings, state};

  explicit Life(const std::filesystem::path& dir) : settings{.checkpoint_directory = dir} {}

  RestoreReport restore() {
    RestoreReport report;
    durability.restore(report);
    return report;
  }
  std::filesystem::path checkpoint() {
    auto [promise, fulfiller] = reply_promise<std::filesystem::path>();
    durability.checkpoint([f = fulfiller](std::exception_ptr error, std::filesystem::path file) {
      if (error) return (*f)->reject(to_kj_exception(error));
      (*f)->fulfill(std::move(file));
    });
    return io.wait(std::move(promise));
  }
};

const std::vector<std::byte> kFourBytes(4);

// Worker `worker`'s push of four bytes into element 0 of variable 0 at `step`.
Push dense(uint32_t worker, uint64_t step, PushedGradient gradient = PushedGradient::whole) {
  return {WorkerId(worker), VariableId(0), Step(step), {0, 1},
          DType::float32,   kFourBytes,    gradient};
}

}  // namespace

TEST_CASE(
    "a restart hands back the checkpoint's state, then the logged updates in order, sparse "
    "pushes, joins and leaves as such") {
  testing::TempDir dir;
  {
    Life life(dir.path);
    life.state.value = 7;
    RestoreReport first = life.restore();
    CHECK(first.checkpoint.empty());
    CHECK(first.replayed == 0);
    VariableSpec spec{.name = "w", .shape = {1}};
    life.durability.log_register(spec, {0, 1}, kFourBytes);
    life.durability.log_push(dense(1, 1));
    life.durability.log_push(dense(1, 2, PushedGradient::sparse));
    life.durability.log_timeout(VariableId(0), Step(3));
    life.durability.log_leave(WorkerId(2));
    life.durability.log_join(WorkerId(2), Step(5));
    TableSpec table;
    table.name = "t";
    table.num_embeddings = 10;
    table.dim = 2;
    life.durability.log_register_table(table);
    table.name = "bounded";
    table.max_rows = 5;
    table.admit_after = 2;
    life.durability.log_register_table(table);
    const std::vector<uint64_t> ids{3, 9};
    const std::vector<std::byte> rows(16);
    life.durability.log_push({.worker = WorkerId(0),
                              .variable = VariableId(1),
                              .step = Step(1),
                              .data = rows,
                              .rows = true,
                              .ids = ids});
  }
  Life again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.checkpoint.filename() == "shard-0.00000001.ckpt");
  CHECK(report.replayed == 9);
  CHECK(again.state.calls ==
        std::vector<std::string>{
            "load 7", "register w [0, 1) 4 bytes", "push w1 v0 s1 [0, 1) 4 bytes",
            "push w1 v0 s2 [0, 1) 4 bytes sparse", "timeout v0 s3", "leave w2", "join w2 s5",
            "table t 10x2", "table bounded 10x2 max 5 admit 2", "rows w0 t1 s1 ids 3,9 16 bytes"});
}

TEST_CASE("updates logged after a checkpoint are all a restart replays") {
  testing::TempDir dir;
  {
    Life life(dir.path);
    life.restore();
    life.durability.log_push(dense(0, 1));
    life.state.value = 8;  // what the checkpoint holds, the push above included
    CHECK(life.checkpoint().filename() == "shard-0.00000002.ckpt");
    life.durability.log_push(dense(0, 2));
  }
  Life again(dir.path);
  CHECK(again.restore().replayed == 1);
  CHECK(again.state.calls == std::vector<std::string>{"load 8", "push w0 v0 s2 [0, 1) 4 bytes"});
}

TEST_CASE("nothing is logged or checkpointed before restore") {
  testing::TempDir dir;
  Life life(dir.path);
  life.durability.log_push(dense(0, 1));
  CHECK(!std::filesystem::exists(dir.path));
  CHECK_THROWS_WITH_AS(life.durability.checkpoint([](std::exception_ptr, std::filesystem::path) {}),
                       doctest::Contains("checkpoint before restore"), Error);
}
