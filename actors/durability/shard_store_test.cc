// SPDX-License-Identifier: Apache-2.0
// Checkpoints and update logs: what a restarted shard restores from its directory.
#include "actors/durability/shard_store.h"

#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <vector>

#include <sys/resource.h>

#include <climits>
#include <csignal>

#include <doctest/doctest.h>

#include "actors/durability/file_io.h"
#include "actors/durability/temp_dir.h"
#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_test_support.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"

using namespace psched;

namespace {

using testing::TempDir;

// One shard process's life: built on a directory, restored, then driven by the test.
struct ShardLife {
  testing::TestLoop io;
  VariableShard shard;

  ShardLife(const std::filesystem::path& dir, Mode mode = Mode::async, bool update_log = true,
            bool accept_log_loss = false)
      : shard(io.actors,
              ShardSettings{ShardId(0), mode, 2, 16, dir, update_log, {}, accept_log_loss}) {}

  void drain() { io.drain(); }

  RestoreReport restore() { return testing::restored(io, shard); }

  VariableId add(const std::string& name, std::vector<float> init) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {init.size()};
    spec.optimizer.kind = optim::OptimizerKind::adam;
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_variable(spec, {0, init.size()}, std::as_bytes(std::span(init)),
                            [&](const Result<VariableShard::Registration>& r) { registered = r; });
    drain();
    REQUIRE(registered);
    if (!*registered) throw registered->error();
    return (*registered)->id;
  }

  void push(WorkerId worker, VariableId id, Step step, ElementRange range, std::vector<float> g,
            PushedGradient gradient = PushedGradient::whole) {
    testing::Receipted receipt;
    shard.push({worker, id, step, range, DType::float32, std::as_bytes(std::span(g)), gradient},
               receipt.reply());
    drain();
    REQUIRE(receipt.done());
    if (receipt.refusal) throw *receipt.refusal;
  }

  std::vector<float> value(VariableId id, uint64_t n) {
    testing::Answered pulled;
    shard.pull(id, {0, n}, pulled.reply());
    drain();
    REQUIRE(pulled.value);
    return *pulled.value;
  }

  std::filesystem::path checkpoint() { return testing::checkpointed(io, shard); }

  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = s; });
    drain();
    return out;
  }
};

// Step s of the pushes below: whole up to `whole_steps`, sparse after.
PushedGradient pushed_at(int s, int whole_steps) {
  return s <= whole_steps ? PushedGradient::whole : PushedGradient::sparse;
}

// Step s's gradient: the same at every whole step; s times it at a sparse one, so that a
// variance updated where it should be frozen shows in the values.
std::vector<float> gradient_at(int s, int whole_steps) {
  const float scale = s <= whole_steps ? 1.0f : static_cast<float>(s);
  return {0.5f * scale, -1 * scale, 2 * scale, 0.25f * scale};
}

// The same pushes, in the same order, on a shard that never restarts. On a thread of its own:
// a thread has one event loop, and the caller's shard holds it.
std::vector<float> uninterrupted(int pushes, int whole_steps = INT_MAX) {
  return std::async(std::launch::async,
                    [pushes, whole_steps] {
                      TempDir dir;
                      ShardLife life(dir.path);
                      life.restore();
                      VariableId w = life.add("w", {1, 2, 3, 4});
                      for (int s = 1; s <= pushes; ++s)
                        life.push(WorkerId(0), w, Step(s), {0, 4}, gradient_at(s, whole_steps),
                                  pushed_at(s, whole_steps));
                      return life.value(w, 4);
                    })
      .get();
}

// While alive, files this process writes cannot grow past `bytes` (RLIMIT_FSIZE): a write
// that would is cut short, then fails with EFBIG, as on a full disk. No root needed.
struct FileSizeLimit {
  rlimit before{};
  explicit FileSizeLimit(uint64_t bytes) {
    std::signal(SIGXFSZ, SIG_IGN);  // else the write kills the process
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    rlimit limited = before;
    limited.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &before); }
};

ErrorCode code_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::internal;
}

// A shard with variable w (4 elements) and steps 1..`steps` of worker 0 logged after its
// first checkpoint; killed (no checkpoint at the end).
void logged_steps(const std::filesystem::path& dir, int steps) {
  ShardLife life(dir);
  life.restore();
  VariableId w = life.add("w", {1, 2, 3, 4});
  for (int s = 1; s <= steps; ++s) life.push(WorkerId(0), w, Step(s), {0, 4}, {0.5f, -1, 2, 0.25f});
}

// Where the `index`-th record (0: the first) of an update log starts.
uint64_t record_offset(const std::filesystem::path& log, int index) {
  std::ifstream in(log, std::ios::binary);
  uint64_t at = kLogHeaderBytes;
  for (int i = 0; i < index; ++i) {
    uint64_t size = 0;
    in.seekg(static_cast<std::streamoff>(at));
    in.read(reinterpret_cast<char*>(&size), sizeof size);
    at += kLogRecordHeaderBytes + size;
  }
  return at;
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
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.checkpoint();
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, Step(3), {0, 2}, {0.5f, -1});  // half a step: logged, not complete
  }                                                          // killed: no checkpoint at the end
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK_FALSE(report.checkpoint.empty());
  CHECK(report.variables == 1);
  CHECK(report.replayed == 2);
  CHECK(report.skipped.empty());
  again.push(WorkerId(0), VariableId(0), Step(3), {2, 4}, {2, 0.25f});
  CHECK(again.value(VariableId(0), 4) == uninterrupted(3));
}

TEST_CASE("sparse pushes after a restart find adam's variance frozen where it was") {
  // The checkpoint keeps the step the variance froze after; the log, which pushes were sparse.
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    for (int s = 1; s <= 4; ++s) {
      if (s == 3) life.checkpoint();
      life.push(WorkerId(0), w, Step(s), {0, 4}, gradient_at(s, 1), pushed_at(s, 1));
    }
  }
  ShardLife again(dir.path);
  CHECK(again.restore().replayed == 2);
  again.push(WorkerId(0), VariableId(0), Step(5), {0, 4}, gradient_at(5, 1),
             PushedGradient::sparse);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(5, 1));
}

TEST_CASE("a push retried after a restart is acknowledged and not applied twice") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardLife again(dir.path);
  again.restore();
  again.push(WorkerId(0), VariableId(0), Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
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
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    newest = life.checkpoint();
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
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
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardStore store(dir.path, ShardId(0));
  std::filesystem::path log = store.log_file(1);
  std::filesystem::resize_file(log, std::filesystem::file_size(log) - 3);
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.replayed == 2);  // the registration and step 1
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].find("torn last record") != std::string::npos);
  CHECK(report.lost.empty());
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
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.checkpoint();
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
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
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    std::filesystem::path written;
    auto replied = kj::newPromiseAndFulfiller<void>();
    life.shard.checkpoint([&](std::exception_ptr, std::filesystem::path f) {
      written = f;
      replied.fulfiller->fulfill();
    });
    std::vector<float> g{0.5f, -1, 2, 0.25f};
    testing::Receipted receipt;
    life.shard.push({WorkerId(0), w, Step(2), {0, 4}, DType::float32, std::as_bytes(std::span(g))},
                    receipt.reply());
    CHECK(receipt.taken());
    life.io.wait(kj::mv(replied.promise));  // the file is written on another thread
    CHECK_FALSE(written.empty());
    CHECK(life.stats().checkpoints_written == 2);  // the one restore wrote, and this one
  }
  ShardLife again(dir.path);
  CHECK(again.restore().replayed == 1);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(2));
}

TEST_CASE("a log write that fails midway is cut back: later acknowledged updates survive") {
  TempDir dir;
  std::filesystem::path log;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    log = ShardStore(dir.path, ShardId(0)).log_file(1);
    uint64_t size = std::filesystem::file_size(log);
    {
      FileSizeLimit full(size + 10);  // room for part of the next record only
      std::string message;
      try {
        life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::io_error);
        message = e.what();
      }
      CHECK(message.find(log.string()) != std::string::npos);
      CHECK(message.find("File too large") != std::string::npos);
      CHECK(std::filesystem::file_size(log) == size);  // the torn part is cut off at once
      CHECK(code_of([&] {
              life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
            }) == ErrorCode::io_error);
    }
    // Space again: the worker resends the refused push, and goes on.
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, Step(3), {0, 4}, {0.5f, -1, 2, 0.25f});
    CHECK(life.stats().errors[static_cast<size_t>(ErrorCode::io_error)] == 2);
  }  // killed
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.skipped.empty());
  CHECK(report.replayed == 4);  // the registration and steps 1-3
  CHECK(again.value(VariableId(0), 4) == uninterrupted(3));
}

TEST_CASE("a checkpoint whose new log cannot be created keeps logging into the old one") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    {
      FileSizeLimit full(10);  // a new log's header does not fit
      CHECK(code_of([&] { life.checkpoint(); }) == ErrorCode::io_error);
    }
    CHECK_FALSE(std::filesystem::exists(ShardStore(dir.path, ShardId(0)).log_file(2)));
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.lost.empty());
  CHECK(again.value(VariableId(0), 4) == uninterrupted(2));
}

TEST_CASE("damage inside the newest log refuses the start, naming the file, byte and loss") {
  TempDir dir;
  logged_steps(dir.path, 4);
  std::filesystem::path log = ShardStore(dir.path, ShardId(0)).log_file(1);
  uint64_t at = record_offset(log, 2);  // step 2's record; steps 3 and 4 follow
  corrupt_byte(log, at + kLogRecordHeaderBytes + 5);
  {
    ShardLife again(dir.path);
    std::string message;
    try {
      again.restore();
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::corrupt_checkpoint);
      message = e.what();
    }
    CHECK(message.find(log.string()) != std::string::npos);
    CHECK(message.find(fmt::format("damaged at byte {}", at)) != std::string::npos);
    CHECK(message.find("would be lost") != std::string::npos);
    CHECK(message.find("--accept-log-loss") != std::string::npos);
  }
  SUBCASE("the operator accepts the loss: replay stops before the damage") {
    {
      ShardLife accepted(dir.path, Mode::async, true, true);
      RestoreReport report = accepted.restore();
      CHECK(report.replayed == 2);  // the registration and step 1
      CHECK(report.lost.find(log.string()) != std::string::npos);
      CHECK(accepted.value(VariableId(0), 4) == uninterrupted(1));
    }
    ShardLife later(dir.path);  // the fresh checkpoint holds what was kept
    RestoreReport report = later.restore();
    CHECK(report.lost.empty());
    CHECK(later.value(VariableId(0), 4) == uninterrupted(1));
  }
}

TEST_CASE("a damaged size field is damage, not a torn tail") {
  TempDir dir;
  logged_steps(dir.path, 3);
  std::filesystem::path log = ShardStore(dir.path, ShardId(0)).log_file(1);
  corrupt_byte(log, record_offset(log, 2) + 3);  // step 2's size
  ShardLife again(dir.path);
  CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains("record header fails its checksum"),
                       Error);
}

TEST_CASE("a tail of zero bytes in the newest log is a torn tail") {
  TempDir dir;
  logged_steps(dir.path, 2);
  std::filesystem::path log = ShardStore(dir.path, ShardId(0)).log_file(1);
  std::filesystem::resize_file(log, std::filesystem::file_size(log) + 4096);
  ShardLife again(dir.path);
  RestoreReport report = again.restore();
  CHECK(report.replayed == 3);
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].find("torn") != std::string::npos);
  CHECK(again.value(VariableId(0), 4) == uninterrupted(2));
}

TEST_CASE("a missing newest log refuses the start: its checkpoint says a log follows it") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.checkpoint();
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  std::filesystem::path log = ShardStore(dir.path, ShardId(0)).log_file(2);
  std::filesystem::remove(log);
  {
    ShardLife again(dir.path);
    std::string expected = fmt::format("update log {} is missing", log.string());
    CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains(expected.c_str()), Error);
  }
  ShardLife accepted(dir.path, Mode::async, true, true);
  RestoreReport report = accepted.restore();
  CHECK_FALSE(report.lost.empty());
  CHECK(accepted.value(VariableId(0), 4) == uninterrupted(1));  // the checkpoint
}

TEST_CASE("a gap between logs is damage") {
  TempDir dir;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    std::filesystem::path first = life.checkpoint();
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    std::filesystem::path second = life.checkpoint();
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
    corrupt_byte(second, std::filesystem::file_size(second) - 5);
  }
  std::filesystem::remove(ShardStore(dir.path, ShardId(0)).log_file(2));
  ShardLife again(dir.path);
  CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains("shard-0.00000002.log is missing"),
                       Error);
}

TEST_CASE("a corrupt newest checkpoint and damage in the previous log: the log is named") {
  TempDir dir;
  std::filesystem::path newest;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    life.push(WorkerId(0), w, Step(2), {0, 4}, {0.5f, -1, 2, 0.25f});
    newest = life.checkpoint();
    life.push(WorkerId(0), w, Step(3), {0, 4}, {0.5f, -1, 2, 0.25f});
  }
  corrupt_byte(newest, std::filesystem::file_size(newest) - 5);
  std::filesystem::path previous = ShardStore(dir.path, ShardId(0)).log_file(1);
  corrupt_byte(previous, record_offset(previous, 1) + kLogRecordHeaderBytes + 3);
  ShardLife again(dir.path);
  std::string message;
  try {
    again.restore();
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find(fmt::format("update log {} is damaged", previous.string())) !=
        std::string::npos);
  CHECK(message.find("1 record(s) in shard-0.00000002.log") != std::string::npos);
  CHECK(message.find("step_from_future") == std::string::npos);
}

TEST_CASE("a torn record in a log that is not the newest is damage") {
  TempDir dir;
  std::filesystem::path newest;
  {
    ShardLife life(dir.path);
    life.restore();
    VariableId w = life.add("w", {1, 2, 3, 4});
    life.push(WorkerId(0), w, Step(1), {0, 4}, {0.5f, -1, 2, 0.25f});
    newest = life.checkpoint();
  }
  corrupt_byte(newest, std::filesystem::file_size(newest) - 5);
  std::filesystem::path previous = ShardStore(dir.path, ShardId(0)).log_file(1);
  std::filesystem::resize_file(previous, std::filesystem::file_size(previous) - 3);
  ShardLife again(dir.path);
  CHECK_THROWS_WITH_AS(again.restore(), doctest::Contains("cut short"), Error);
}

TEST_CASE("a directory written whole appears beside its name, and never over one made meanwhile") {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto to = dir.path / "out";
  write_directory(to / "", ".partial", [&](const std::filesystem::path& staging) {
    CHECK(staging == std::filesystem::path(to.string() + ".partial"));  // beside, not inside
    std::filesystem::create_directories(staging);
    std::ofstream(staging / "a") << "a";
  });
  CHECK(std::filesystem::exists(to / "a"));
  const auto late = dir.path / "late";
  CHECK_THROWS_WITH_AS(
      write_directory(late, ".partial",
                      [&](const std::filesystem::path& staging) {
                        std::filesystem::create_directories(staging);
                        std::filesystem::create_directories(late);  // another run's, meanwhile
                      }),
      doctest::Contains("late exists (made while it was written); nothing of it replaced"), Error);
  CHECK(std::filesystem::is_empty(late));
  CHECK(!std::filesystem::exists(dir.path / "late.partial"));
}
