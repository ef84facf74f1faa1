// SPDX-License-Identifier: Apache-2.0
// psched import (actors/shard/model_import.h) on the exports of real VariableShards' jobs: a job
// exported with its optimizer state and imported on any number of shards holds every row and
// value as before and trains on exactly as it would have; a value changed in the export's
// arrays is the imported job's; an export it cannot import is refused naming why, writing
// nothing. The same from torch, through psched.torch.export: python/tests/test_embedding_exact.py.
#include "actors/shard/model_import.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/durability/npy_file.h"
#include "actors/durability/temp_dir.h"
#include "actors/shard/job_test_support.h"
#include "actors/shard/model_export.h"
#include "common/error.h"

using namespace psched;
using namespace psched::testing;
using nlohmann::json;

namespace {

// A two-shard job trained two steps, checkpointed in `state` and exported into `out`.
void exported_job(const fs::path& state, const fs::path& out, bool with_optimizer_state = true) {
  {
    Job job(2, state);
    job.train(1);
    job.train(2);
    job.checkpoint();
  }
  fs::remove_all(out);
  export_model({.from = {state}, .to = out, .with_optimizer_state = with_optimizer_state});
}

std::string refusal(const ImportOptions& options) {
  try {
    import_model(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no refusal)";
}

json manifest(const fs::path& folder) {
  std::ifstream in(folder / "manifest.json");
  return json::parse(in);
}

void rewrite_manifest(const fs::path& folder, const json& m) {
  std::ofstream(folder / "manifest.json") << m.dump(1);
}

// Overwrites element `index` of the array of `descr` and `shape` in .npy file `file`.
template <typename T>
void set_element(const fs::path& file, std::string_view descr, std::vector<uint64_t> shape,
                 uint64_t index, T value) {
  const std::string header = NpyFile::header(descr, shape);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(header.size() + index * sizeof(T)));
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

TEST_CASE("an exported job imported on any number of shards holds every value and trains on") {
  for (uint32_t to : {2u, 3u, 1u}) {
    CAPTURE(to);
    testing::TempDir state, folder, placed, reference;
    std::vector<double> before, trained_on;
    {  // the job on 2 shards throughout: after step 2, and after step 3
      Job job(2, reference.path);
      job.train(1);
      job.train(2);
      before = job.everything();
      job.train(3);
      trained_on = job.everything();
    }
    exported_job(state.path, folder.path);
    fs::remove_all(placed.path);
    const ImportReport report = import_model(
        {.from = folder.path, .to = placed.path, .shards = to, .split_bytes = kSplitBytes});
    CHECK(report.step == 2);
    CHECK(report.rows > 0);
    CHECK(report.placed.from_shards == 2);
    CHECK(report.placed.rows == report.rows);
    CHECK(report.placed.written.size() == to);
    fs::path staging = placed.path;
    CHECK(!fs::exists(staging += ".import-partial"));
    Job imported(to, placed.path, /*job=*/99);  // the export's job and map win
    CHECK(imported.map == SlotMap::even(2).rebalanced(to));
    CHECK(imported.shards[0]->shard.job() == 1);
    CHECK(imported.everything() == before);
    imported.train(3);  // each part's steps and optimizer state came along: adam's and adagrad's
    CHECK(imported.everything() == trained_on);
  }
}

TEST_CASE("a value changed in the export's arrays is the imported job's") {
  testing::TempDir state, folder, placed;
  exported_job(state.path, folder.path);
  const json t = manifest(folder.path)["tables"][0];
  std::vector<int64_t> ids(t["rows"].get<size_t>());
  {
    NpyReader reader(folder.path / t["ids"].get<std::string>());
    reader.read(std::as_writable_bytes(std::span(ids)));
  }
  set_element(folder.path / t["values"].get<std::string>(), "<f8", {ids.size(), 2}, 2 * 5 + 1,
              42.0);  // row 5's second element
  fs::remove_all(placed.path);
  import_model({.from = folder.path, .to = placed.path, .shards = 3, .split_bytes = kSplitBytes});
  Job imported(3, placed.path);
  const std::vector<double> everything = imported.everything();
  CHECK(everything[2 * static_cast<uint64_t>(ids[5]) + 1] == 42.0);
}

TEST_CASE("an export without optimizer state, damaged or of another model is refused") {
  testing::TempDir state, folder, placed;
  exported_job(state.path, folder.path);
  fs::remove_all(placed.path);
  const ImportOptions options{.from = folder.path, .to = placed.path, .shards = 3};
  const json m = manifest(folder.path);
  const json t = m["tables"][0];
  SUBCASE("exported without optimizer state") {
    testing::TempDir plain_state, plain;
    exported_job(plain_state.path, plain.path, false);
    const std::string why = refusal({.from = plain.path, .to = placed.path, .shards = 3});
    CHECK(why.starts_with(
        fmt::format("import: {} was exported without its optimizer state", plain.path.string())));
    CHECK(why.find("--with-optimizer-state") != std::string::npos);
  }
  SUBCASE("no manifest") {
    CHECK(refusal({.from = state.path, .to = placed.path, .shards = 3}) ==
          fmt::format("import: {} has no manifest.json: name a folder psched export wrote",
                      state.path.string()));
  }
  SUBCASE("resume.bin missing") {
    fs::remove(folder.path / "resume.bin");
    CHECK(refusal(options) == fmt::format("import: {} is missing: the export is not whole",
                                          (folder.path / "resume.bin").string()));
  }
  SUBCASE("resume.bin cut short") {
    fs::resize_file(folder.path / "resume.bin", fs::file_size(folder.path / "resume.bin") - 3);
    CHECK(refusal(options).find("resume.bin: truncated at byte") != std::string::npos);
  }
  SUBCASE("a table's values of another shape") {
    NpyFile wrong(folder.path / t["values"].get<std::string>(), "<f8",
                  {t["rows"].get<uint64_t>(), 3}, 8);
    const std::string why = refusal(options);
    CHECK(why.starts_with(fmt::format("table 't' values ({}) is '<f8' of shape ({}, 3) where",
                                      (folder.path / "tables/t/values.npy").string(),
                                      t["rows"].get<uint64_t>())));
  }
  SUBCASE("a table's values of another dtype") {
    NpyFile wrong(folder.path / t["values"].get<std::string>(), "<f4",
                  {t["rows"].get<uint64_t>(), 2}, 4);
    CHECK(refusal(options).find("is '<f4' of shape") != std::string::npos);
  }
  SUBCASE("rows reordered across the shards") {
    const fs::path ids = folder.path / t["ids"].get<std::string>();
    std::vector<int64_t> all(t["rows"].get<size_t>());
    {
      NpyReader reader(ids);
      reader.read(std::as_writable_bytes(std::span(all)));
    }
    std::reverse(all.begin(), all.end());  // shard 1's rows first
    NpyFile rewritten(ids, "<i8", {all.size()}, 8);
    rewritten.write(std::as_bytes(std::span(all)));
    rewritten.finish();
    const std::string why = refusal(options);
    CHECK(why.find("is among shard 0's rows of table 't', but the job's slot map gives it to "
                   "shard 1") != std::string::npos);
  }
  SUBCASE("a state file missing") {
    fs::remove(folder.path / t["state"].get<std::string>());
    CHECK(refusal(options).ends_with("(table 't' state) is missing: the export is not whole"));
  }
  SUBCASE("an id past the table's rows") {
    const fs::path ids = folder.path / t["ids"].get<std::string>();
    set_element(ids, "<i8", {t["rows"].get<uint64_t>()}, 1, static_cast<int64_t>(kRows));
    CHECK(refusal(options) == fmt::format("import: {}: id {} of table 't', which has {} rows",
                                          ids.string(), kRows, kRows));
  }
  SUBCASE("a manifest entry missing") {
    json other = m;
    other["tables"][0].erase("ids");
    rewrite_manifest(folder.path, other);
    CHECK(refusal(options).find("the manifest does not read as psched export writes it") !=
          std::string::npos);
  }
  SUBCASE("a manifest of another model") {
    json other = m;
    other["dense"][0]["shape"] = {7};
    rewrite_manifest(folder.path, other);
    CHECK(refusal(options).find("the two are of different models") != std::string::npos);
  }
  SUBCASE("a directory that exists") {
    fs::create_directories(placed.path);
    CHECK(refusal(options) == fmt::format("import: {} exists; name a new directory for the new "
                                          "shards",
                                          placed.path.string()));
    fs::remove_all(placed.path);
  }
  CHECK(!fs::exists(placed.path));
  fs::path staging = placed.path;
  CHECK(!fs::exists(staging += ".import-partial"));
}
