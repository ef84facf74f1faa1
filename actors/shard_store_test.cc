// Checkpoints and update logs: what a restarted shard restores from its directory.
#include "actors/shard_store.h"

#include <filesystem>
#include <future>
#include <fstream>
#include <optional>
#include <vector>

#include <doctest/doctest.h>

#include "actors/test_loop.h"
#include "actors/variable_shard.h"
#include "common/error.h"

using namespace psched;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           fmt::format("psched-store-{}-{}", ::getpid(), counter()++);
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// One shard process's life: built on a directory, restored, then driven by the test.
struct ShardLife {
  testing::TestLoop io;
  VariableShard shard;

  ShardLife(const std::filesystem::path& dir, Mode mode = Mode::async, bool update_log = true)
      : shard(io.actors, ShardSettings{ShardId(0), mode, 2, 16, dir, update_log}) {}

  void drain() {
    io.drain();
  }

  RestoreReport restore() {
    std::exception_ptr error;
    RestoreReport report;
    shard.restore([&](std::exception_ptr e, RestoreReport r) {
      error = e;
      report = std::move(r);
    });
    drain();
    if (error) std::rethrow_exception(error);
    return report;
  }

  VariableId add(const std::string& name, std::vector<float> init) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {init.size()};
    spec.optimizer.kind = optim::OptimizerKind::adam;
    VariableId id;
    std::exception_ptr error;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](std::exception_ptr e, VariableId v, bool) {
                              error = e;
                              id = v;
                            });
    drain();
    if (error) std::rethrow_exception(error);
    return id;
  }

  void push(WorkerId worker, VariableId id, Step step, ElementRange range, std::vector<float> g) {
    std::exception_ptr error;
    shard.push(worker, id, step, range, DType::float32, std::as_bytes(std::span(g)),
               [&](std::exception_ptr e) { error = e; });
    drain();
    if (error) std::rethrow_exception(error);
  }

  std::vector<float> value(VariableId id, uint64_t n) {
    std::vector<float> out(n);
    shard.pull(id, {0, n}, [&](std::exception_ptr, const FreshValue* v) {
      v->read_into(reinterpret_cast<std::byte*>(out.data()));
    });
    drain();
    return out;
  }

  std::filesystem::path checkpoint() {
    std::exception_ptr error;
    std::filesystem::path file;
    auto written = kj::newPromiseAndFulfiller<void>();
    shard.checkpoint([&](std::exception_ptr e, std::filesystem::path f) {
      error = e;
      file = f;
      written.fulfiller->fulfill();
    });
    io.wait(kj::mv(written.promise));  // the file is written on another thread
    if (error) std::rethrow_exception(error);
    return file;
  }

  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = s; });
    drain();
    return out;
  }
};

// The same pushes, in the same order, on a shard that never restarts. On a thread of its own:
// a thread has one event loop, and the caller's shard holds it.
std::vector<float> uninterrupted(int pushes) {
  return std::async(std::launch::async, [pushes] {
           TempDir dir;
           ShardLife life(dir.path);
           life.restore();
           VariableId w = life.add("w", {1, 2, 3, 4});
           for (int s = 1; s <= pushes; ++s)
             life.push(WorkerId(0), w, s, {0, 4}, {0.5f, -1, 2, 0.25f});
           return life.value(w, 4);
         })
      .get();
}

void corrupt_byte(const std::filesystem::path& file, uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace

TEST_CASE("a first start finds no checkpoint and writes an empty one") {
  TempDir dir;
  ShardLife life(dir.path);
  RestoreReport report = life.restore();
  CHECK(report.checkpoint.empty());
  CHECK(report.variables == 0);
  CHECK(std::filesystem::exists(report.written));
}

TEST_CASE("a restart restores the checkpoint and replays the logged updates after it") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
    life.checkpoint();
    life.push(WorkerId(0), w, 2, {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, 3, {0, 2}, {0.5f, -1});  // half a step: logged, not complete
  }                                                    // killed: no checkpoint at the end
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK_FALSE(report.checkpoint.empty());
  CHECK(report.variables == 1);
  CHECK(report.replayed == 2);
  CHECK(report.skipped.empty());
  again.push(WorkerId(0), VariableId(0), 3, {2, 4}, {2, 0.25f});
  CHECK(again.value(VariableId(0), 4) == uninterrupted(3));
}

TEST_CASE("a push retried after a restart is acknowledged and not applied twice") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardLife again(dir.path);
  again.restore();
  again.push(WorkerId(0), VariableId(0), 1, {0, 4}, {0.5f, -1, 2, 0.25f});
  CHECK(again.stats().pushes_duplicate == 1);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(1));
}

TEST_CASE("a corrupt newest checkpoint is skipped for the previous one and both logs") {
  TempDir dir;
  std::filesystem::path newest;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
    newest = life.checkpoint();
    life.push(WorkerId(0), w, 2, {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  corrupt_byte(newest, std::filesystem::file_size(newest) - 5);
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].find("checksum") != std::string::npos);
  CHECK(report.checkpoint != newest);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(2));
}

TEST_CASE("a torn last log record is dropped: it was never acknowledged") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, 2, {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardStore store(dir.path, ShardId(0));
  std::filesystem::path log = store.log_file(1);
  std::filesystem::resize_file(log, std::filesystem::file_size(log) - 3);
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.replayed == 2);  // the registration and step 1
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].find("truncated") != std::string::npos);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(1));
}

TEST_CASE("only corrupt checkpoints stop the start instead of starting empty") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    life.add("w", {1, 2});
  }
  ShardStore store(dir.path, ShardId(0));
  corrupt_byte(store.checkpoint_file(1), 0);
  ShardLife again(dir.path);
  CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains("no valid checkpoint"), Error);
}

TEST_CASE("a checkpoint of another mode is refused with both modes named") {
  TempDir dir;
  {
    ShardLife life(dir.path, Mode::async);
    life.restore();
  }
  ShardLife again(dir.path, Mode::sync);
  CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains("async mode"), Error);
}

TEST_CASE("without the update log a restart rolls back to the last checkpoint") {
  TempDir dir;
  {
    ShardLife life(dir.path, Mode::async, false);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
    life.checkpoint();
    life.push(WorkerId(0), w, 2, {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardLife again(dir.path, Mode::async, false);
  CHECK(again.restore().replayed == 0);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(1));
}

TEST_CASE("old generations are deleted once two newer checkpoints exist") {
  TempDir dir;
  ShardLife life(dir.path);
  life.restore();
  std::ofstream(dir.path / "shard-0.00000001.ckpt.tmp") << "a write a crash interrupted";
  for (int i = 0; i < 4; ++i) life.checkpoint();
  ShardStore store(dir.path, ShardId(0));
  CHECK_FALSE(std::filesystem::exists(store.checkpoint_file(3)));
  CHECK(std::filesystem::exists(store.checkpoint_file(4)));
  CHECK(std::filesystem::exists(store.checkpoint_file(5)));
  CHECK(std::filesystem::exists(store.log_file(5)));
  CHECK_FALSE(std::filesystem::exists(dir.path / "shard-0.00000001.ckpt.tmp"));
}

TEST_CASE("pushes accepted while a checkpoint is written go to the new log and survive") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, 1, {0, 4}, {0.5f, -1, 2, 0.25f});
    std::filesystem::path written;
    auto replied = kj::newPromiseAndFulfiller<void>();
    life.shard.checkpoint([&](std::exception_ptr, std::filesystem::path f) {
      written = f;
      replied.fulfiller->fulfill();
    });
    std::vector<float> g{0.5f, -1, 2, 0.25f};
    life.shard.push(WorkerId(0), w, 2, {0, 4}, DType::float32, std::as_bytes(std::span(g)),
                    [](std::exception_ptr e) { REQUIRE_FALSE(e); });
    life.io.wait(kj::mv(replied.promise));  // the file is written on another thread
    CHECK_FALSE(written.empty());
    CHECK(life.stats().checkpoints_written == 2);  // the one restore wrote, and this one
  }
  ShardLife again(dir.path);
  CHECK(again.restore().replayed == 1);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(2));
}
