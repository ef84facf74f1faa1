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
#include "actors/shard/job_test_support.h"
#include "common/error.h"

using namespace psched;
using namespace psched::testing;
namespace fs = std::filesystem;

namespace {

std::string refusal(const ReshardOptions& options) {
  try {
    reshard(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no refusal)";
}

// The newest update log of shard `id` in `dir`.
fs::path newest_log(const fs::path& dir, uint32_t id) {
  ShardStore store(dir, ShardId(id));
  return store.log_file(store.newest_generation());
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
    remove_shard_files(a.path, 1);
    CHECK(refusal(options) ==
          "reshard: the set is incomplete: the job ran on 2 shards and shard 1 has no checkpoint "
          "in the directories given");
  }
  SUBCASE("two jobs") {
    remove_shard_files(a.path, 1);
    remove_shard_files(b.path, 0);
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
