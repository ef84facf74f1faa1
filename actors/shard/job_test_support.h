// SPDX-License-Identifier: Apache-2.0
// A job of real VariableShards on one test loop, writing checkpoints into a directory and
// restored from them: what the tests of psched reshard and psched export (reshard_test.cc,
// model_export_test.cc) make their checkpoints with. Worker 0 trains a float64 table "t" of
// kRows rows (adagrad, uniform init, seed 7) and two float32 dense variables, "w" (3 elements,
// whole) and "big" (40, split over the shards at kSplitBytes), in async mode unless the Job is
// made in another.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "actors/shard/variable_shard.h"
#include "common/placement.h"

namespace psched::testing {

namespace fs = std::filesystem;

inline constexpr uint64_t kRows = 200;
inline constexpr uint64_t kSplitBytes = 64;  // "big" (40 floats) is split, "w" (3 floats) is not

inline TableSpec table_spec(uint64_t max_rows = 0, uint32_t admit_after = 0) {
  TableSpec spec{.name = "t", .num_embeddings = kRows, .dim = 2, .dtype = DType::float64};
  spec.max_rows = max_rows;
  spec.admit_after = admit_after;
  spec.optimizer.kind = optim::RowOptimizerKind::adagrad;
  spec.optimizer.lr = 0.5;
  spec.init = {RowInit::Kind::uniform, -1, 1};
  spec.seed = 7;
  return spec;
}

inline VariableSpec dense_spec(std::string name, uint64_t elements) {
  VariableSpec spec{.name = std::move(name), .shape = {elements}};
  spec.optimizer.kind = optim::OptimizerKind::adam;
  spec.optimizer.lr = 0.1;
  return spec;
}

// One shard of a job, on the job's loop.
struct JobShard {
  TestLoop& io;
  VariableShard shard;
  std::vector<std::vector<uint64_t>> kept;  // ids borrowed by polls

  JobShard(TestLoop& loop, uint32_t id, uint32_t shards, const fs::path& dir, uint64_t job,
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
    return registered(
        [&](auto reply) { shard.register_variable(spec, part, bytes_of(initial), reply); });
  }
  void push(const Push& push) {
    Receipted receipt;
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
    Answered answer;
    shard.pull(variable, range, answer.reply());
    io.drain();
    REQUIRE(answer.value);
    return *answer.value;
  }
};

// A job's shards on one loop, restored from (or started in) `dir`, placing by their slot map.
struct Job {
  TestLoop io;
  std::vector<std::unique_ptr<JobShard>> shards;
  SlotMap map;
  TableSpec table = table_spec();

  Job(uint32_t count, const fs::path& dir, uint64_t job = 1, Mode mode = Mode::async) {
    for (uint32_t i = 0; i < count; ++i) {
      shards.push_back(std::make_unique<JobShard>(io, i, count, dir, job, mode));
      restored(shards.back()->io, shards.back()->shard);
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
        shards[s]->push({WorkerId(0), id, Step(step), range, DType::float32, bytes_of(g)});
      }
  }
  void checkpoint() {
    for (auto& s : shards) checkpointed(s->io, s->shard);
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

// Removes shard `shard`'s checkpoints and logs from `dir`.
inline void remove_shard_files(const fs::path& dir, uint32_t shard) {
  const std::string prefix = "shard-" + std::to_string(shard) + ".";
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with(prefix)) fs::remove(entry.path());
}

// The settings a Job's shards run with (any shard's): what its logs are replayed under.
inline ShardSettings job_settings(uint32_t shards) {
  return {ShardId(0), Mode::async, 1, 64, {}, true, {}, false, 0, {}, shards, 1};
}

// Every file of `dir`, by name: its bytes.
inline std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().filename().string()].assign(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// A job on 2 shards in `dir` that trained steps 1 to `steps` and checkpointed after step 2:
// its later steps are in its update logs alone, as a SIGKILL leaves them.
inline std::vector<double> killed_after(const fs::path& dir, uint64_t steps) {
  Job job(2, dir);
  for (uint64_t step = 1; step <= steps; ++step) {
    job.train(step);
    if (step == 2) job.checkpoint();
  }
  return job.everything();
}

}  // namespace psched::testing
