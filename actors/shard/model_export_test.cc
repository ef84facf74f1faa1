// SPDX-License-Identifier: Apache-2.0
// psched export (actors/shard/model_export.h) on the checkpoints of real VariableShards: the
// folder holds every dense value and every stored row as the shards hold them, bit for bit, with
// a manifest that says what the model is; a set it cannot export is refused naming why, writing
// nothing. numpy and torch read such a folder in python/tests/test_export.py.
#include "actors/shard/model_export.h"

#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/durability/file_io.h"
#include "actors/durability/temp_dir.h"
#include "actors/shard/job_test_support.h"
#include "common/error.h"

using namespace psched;
using namespace psched::testing;
using nlohmann::json;

namespace {

// The header's dictionary and the data of a .npy file.
struct Npy {
  std::string header;
  std::vector<std::byte> data;

  template <typename T>
  std::vector<T> as() const {
    std::vector<T> out(data.size() / sizeof(T));
    std::memcpy(out.data(), data.data(), data.size());
    return out;
  }
};

Npy read_npy(const fs::path& file) {
  const std::vector<std::byte> bytes = read_file(file);
  REQUIRE(bytes.size() >= 10);
  const size_t length =
      std::to_integer<size_t>(bytes[8]) + (std::to_integer<size_t>(bytes[9]) << 8);
  REQUIRE(bytes.size() >= 10 + length);
  return {std::string(reinterpret_cast<const char*>(bytes.data()) + 10, length),
          std::vector<std::byte>(bytes.begin() + static_cast<ptrdiff_t>(10 + length), bytes.end())};
}

json read_manifest(const fs::path& folder) {
  std::ifstream in(folder / "manifest.json");
  return json::parse(in);
}

// Table `table`'s ids in the export in `folder`, each one's exported value checked against
// `everything` (Job::everything: the shards' rows of "t" first, two values a row).
std::vector<uint64_t> exported_rows(const fs::path& folder, const json& table,
                                    const std::vector<double>& everything) {
  const std::vector<uint64_t> ids =
      read_npy(folder / table["ids"].get<std::string>()).as<uint64_t>();
  const std::vector<double> values =
      read_npy(folder / table["values"].get<std::string>()).as<double>();
  REQUIRE(values.size() == 2 * ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    CAPTURE(ids[k]);
    CHECK(values[2 * k] == everything[2 * ids[k]]);
    CHECK(values[2 * k + 1] == everything[2 * ids[k] + 1]);
  }
  return ids;
}

std::string refusal(const ExportOptions& options) {
  try {
    export_model(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no refusal)";
}

// A two-shard job trained two steps and checkpointed in `dir`.
void trained_job(const fs::path& dir, uint64_t job_id = 1) {
  Job job(2, dir, job_id);
  job.train(1);
  job.train(2);
  job.checkpoint();
}

}  // namespace

TEST_CASE("an export holds every dense value and stored row as the shards do, and says so") {
  testing::TempDir state, out;
  fs::remove_all(out.path);
  trained_job(state.path);
  Job job(2, state.path);  // restored: what the shards hold
  const std::vector<double> everything = job.everything();
  // Names too long for a shard id or generation are no checkpoints (std::stoul threw on them).
  std::ofstream(state.path / "shard-9999999999999999999999999.1.ckpt") << "x";
  std::ofstream(state.path / "shard-0.999999999999999999999.ckpt") << "x";

  const ExportReport report = export_model({.from = {state.path}, .to = out.path});
  const json m = read_manifest(out.path);
  CHECK(m["format"] == "psched-export");
  CHECK(m["version"] == kExportVersion);
  CHECK(m["job"] == "0000000000000001");
  CHECK(m["mode"] == "async");
  CHECK(m["step"] == 2);
  CHECK(m["slot_map"]["shards"] == 2);
  CHECK(m["slot_map"]["epoch"] == job.map.epoch());
  CHECK(m["optimizer_state"] == false);
  CHECK(report.step == 2);
  CHECK(report.shards == 2);
  CHECK(report.variables == 2);
  CHECK(report.tables == 1);

  // Dense: each variable whole, in its shape, the shards' values.
  REQUIRE(m["dense"].size() == 2);
  for (const json& v : m["dense"]) {
    CHECK(v["dtype"] == "float32");
    CHECK(v["optimizer"]["kind"] == "adam");
    CHECK(v["optimizer"]["lr"] == 0.1);
    CHECK(v["state"].empty());
    const VariableSpec spec = dense_spec(v["name"], v["shape"][0]);
    std::vector<float> expected;
    for (auto [s, id, range] : job.variables(spec))
      for (float x : job.shards[s]->values(id, range)) expected.push_back(x);
    const Npy file = read_npy(out.path / v["file"].get<std::string>());
    CHECK(file.header.starts_with(fmt::format(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", spec.elements())));
    CHECK(file.as<float>() == expected);
  }

  // The table: each stored row once, its value the shards'; the spec in the manifest.
  REQUIRE(m["tables"].size() == 1);
  const json& t = m["tables"][0];
  CHECK(t["name"] == "t");
  CHECK(t["num_embeddings"] == kRows);
  CHECK(t["dim"] == 2);
  CHECK(t["dtype"] == "float64");
  CHECK(t["init"] == json{{"kind", "uniform"}, {"a", -1.0}, {"b", 1.0}});
  CHECK(t["seed"] == 7);
  CHECK(t["step"] == 2);
  CHECK(t["optimizer"]["kind"] == "adagrad");
  CHECK(t["optimizer"]["lr"] == 0.5);
  CHECK(t["state"].is_null());
  CHECK(t["ids_dtype"] == "int64");
  CHECK(read_npy(out.path / "tables/t/ids.npy").header.starts_with("{'descr': '<i8'"));
  CHECK(!fs::exists(out.path / "tables/t/state.npy"));
  const std::vector<uint64_t> ids = exported_rows(out.path, t, everything);
  std::set<uint64_t> trained;
  for (uint64_t id = 0; id < kRows; id += 1 + id % 3) trained.insert(id);
  CHECK(std::set<uint64_t>(ids.begin(), ids.end()) == trained);
  CHECK(ids.size() == trained.size());
  CHECK(t["rows"] == ids.size());
  CHECK(report.rows == ids.size());
  fs::path partial = out.path;
  CHECK(!fs::exists(partial += ".partial"));
}

TEST_CASE("with optimizer state, each dense slot and each row's state are exported too") {
  testing::TempDir state, out;
  fs::remove_all(out.path);
  trained_job(state.path);
  export_model({.from = {state.path}, .to = out.path, .with_optimizer_state = true});
  const json m = read_manifest(out.path);
  CHECK(m["optimizer_state"] == true);
  for (const json& v : m["dense"]) {
    REQUIRE(v["state"].size() == 2);  // adam: exp_avg, exp_avg_sq
    const std::vector<float> v_hat =
        read_npy(out.path / v["state"][1].get<std::string>()).as<float>();
    CHECK(v_hat.size() == v["shape"][0]);
    CHECK(std::all_of(v_hat.begin(), v_hat.end(), [](float x) { return x > 0; }));
  }
  const json& t = m["tables"][0];
  CHECK(t["state_elements"] == 2);  // adagrad: a sum per element
  const Npy sums = read_npy(out.path / t["state"].get<std::string>());
  CHECK(sums.header.find(fmt::format("'shape': ({}, 2)", t["rows"].get<uint64_t>())) !=
        std::string::npos);
  const std::vector<double> s = sums.as<double>();
  CHECK(s.size() == 2 * t["rows"].get<uint64_t>());
  CHECK(std::all_of(s.begin(), s.end(), [](double x) { return x > 0; }));
}

TEST_CASE("a killed job's logged updates are replayed into the export, its files kept") {
  testing::TempDir state, out;
  fs::remove_all(out.path);
  const std::vector<double> everything = killed_after(state.path, 4);
  const auto files = contents(state.path);
  const ExportReport report =
      export_model({.from = {state.path}, .to = out.path, .replay = job_settings(2)});
  REQUIRE(report.replayed.size() == 2);
  CHECK(report.replayed[0].updates > 0);
  CHECK(report.replayed[1].updates > 0);
  CHECK(report.step == 4);
  CHECK(contents(state.path) == files);
  CHECK(!fs::exists(out.path / "restored"));
  const json m = read_manifest(out.path);
  CHECK(m["step"] == 4);
  REQUIRE(m["replayed"].size() == 2);
  CHECK(m["replayed"][1]["updates"] == report.replayed[1].updates);
  CHECK(m["checkpoints"][0] == report.replayed[0].checkpoint.string());
  CHECK(exported_rows(out.path, m["tables"][0], everything).size() == m["tables"][0]["rows"]);
}

TEST_CASE("an incomplete set, two jobs, logged updates or an existing folder are refused") {
  testing::TempDir a, b, out;
  fs::remove_all(out.path);
  trained_job(a.path, 1);
  trained_job(b.path, 2);
  const ExportOptions options{.from = {a.path}, .to = out.path};
  SUBCASE("a shard missing") {
    remove_shard_files(a.path, 1);
    CHECK(refusal(options) ==
          "export: the set is incomplete: the job ran on 2 shards and shard 1 has no checkpoint "
          "in the directories given");
  }
  SUBCASE("two jobs") {
    remove_shard_files(a.path, 1);
    remove_shard_files(b.path, 0);
    const std::string why = refusal({.from = {a.path, b.path}, .to = out.path});
    CHECK(why.starts_with("export: "));
    CHECK(why.find("are not of one job: job 0000000000000001") != std::string::npos);
  }
  SUBCASE("updates logged after the checkpoint, with no deployment to replay them under") {
    {
      Job job(2, a.path, 1);
      job.train(3);
    }
    const std::string why = refusal(options);
    CHECK(why.starts_with("export: shard 0 in " + a.path.string() + ": "));
    CHECK(why.find("update(s) logged after checkpoint") != std::string::npos);
    CHECK(why.find("give the job's deployment file (psched export --from-config FILE") !=
          std::string::npos);
  }
  SUBCASE("a folder that exists") {
    fs::create_directories(out.path);
    CHECK(refusal(options) ==
          fmt::format("export: {} exists; name a new folder for the export", out.path.string()));
    fs::remove_all(out.path);
  }
  SUBCASE("no checkpoint at all") {
    testing::TempDir empty;
    fs::create_directories(empty.path);
    CHECK(refusal({.from = {empty.path}, .to = out.path}) ==
          fmt::format("export: {} holds no shard checkpoint (no shard-<id>.<generation>.ckpt "
                      "file): name the job's checkpoint directory",
                      empty.path.string()));
  }
  CHECK(!fs::exists(out.path));
  fs::path partial = out.path;
  CHECK(!fs::exists(partial += ".partial"));
}
