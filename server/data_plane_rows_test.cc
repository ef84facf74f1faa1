// SPDX-License-Identifier: Apache-2.0
// DataPlane's rows requests (pushRows, pullRows) with a real VariableShard on the test's own loop:
// decoded from the front end's bytes, checked, handed to the shard's table, answered; a sync
// push of the step after the one under way held until that step closes.
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "common/error.h"
#include "compression/codec.h"
#include "server/data_plane.h"

using namespace psched;

namespace {

// Keeps every answer it takes, with its value's bytes as they left.
struct KeepingWriter final : AnswerWriter {
  std::vector<Answer> taken;
  std::vector<std::vector<std::byte>> bytes;

  bool has_room() override { return true; }
  void take(Answer& answer) override {
    bytes.emplace_back(answer.value.begin(), answer.value.end());
    taken.push_back(answer);
  }
  void send() override {}
  kj::Promise<void> written() override { return kj::READY_NOW; }

  // The answer to request `id`, or null.
  const Answer* answer(uint64_t id) const {
    for (const Answer& a : taken)
      if (a.id == id) return &a;
    return nullptr;
  }
  std::vector<float> floats(uint64_t id) const {
    for (size_t i = 0; i < taken.size(); ++i)
      if (taken[i].id == id) {
        std::vector<float> out(bytes[i].size() / sizeof(float));
        std::memcpy(out.data(), bytes[i].data(), bytes[i].size());
        return out;
      }
    FAIL("no answer to request ", id);
    return {};
  }
};

// A shard of `workers` workers in `mode` holding table "emb" (100 rows of 2 float32 elements,
// zeros at first, SGD lr 1), and a plane per worker.
struct RowsFixture {
  testing::TestLoop io;
  VariableShard shard;
  DeploymentConfig config;
  ShardEndpoint endpoint{shard, config, ShardId(0)};
  std::vector<KeepingWriter> writers;
  std::vector<std::shared_ptr<DataPlane>> planes;
  VariableId table;
  std::deque<std::vector<std::byte>> kept;  // requests' bytes, alive until the test ends

  RowsFixture(Mode mode, uint32_t workers, uint64_t max_waiting_polls = 64)
      : shard(io.actors, ShardSettings{.mode = mode, .workers = workers, .max_variables = 8}),
        writers(workers) {
    config.limits.max_waiting_polls = max_waiting_polls;
    for (uint32_t w = 0; w < workers; ++w)
      planes.push_back(std::make_shared<DataPlane>(endpoint, WorkerId(w), writers[w]));
    TableSpec spec{.name = "emb", .num_embeddings = 100, .dim = 2};
    spec.optimizer.lr = 1;
    std::optional<Result<VariableShard::Registration>> registered;
    shard.register_table(spec,
                         [&](const Result<VariableShard::Registration>& r) { registered = r; });
    io.drain();
    REQUIRE((registered && *registered));
    table = (*registered)->id;
  }

  std::span<const std::byte> keep(std::vector<std::byte> bytes) {
    return kept.emplace_back(std::move(bytes));
  }
  std::span<const std::byte> ids_bytes(const std::vector<uint64_t>& ids) {
    return keep({std::as_bytes(std::span(ids)).begin(), std::as_bytes(std::span(ids)).end()});
  }
  // Worker `worker`'s push of step `step`: `ids` with rows `rows`, served now.
  void push(uint32_t worker, uint64_t id, uint64_t step, const std::vector<uint64_t>& ids,
            const std::vector<float>& rows, WireFormat format = WireFormat::none) {
    std::vector<std::byte> body(encoded_bytes(format, DType::float32, rows.size()));
    narrow_values(format, DType::float32, std::as_bytes(std::span(rows)), body);
    planes[worker]->serve({.kind = RequestKind::push_rows,
                           .id = id,
                           .variable = table.value,
                           .step = step,
                           .format = format,
                           .gradient = keep(std::move(body)),
                           .ids = ids_bytes(ids)});
    io.drain();
  }
  // Worker `worker`'s pull of `ids` once `step` is applied, served now.
  void pull(uint32_t worker, uint64_t id, uint64_t step, const std::vector<uint64_t>& ids,
            WireFormat value_format = WireFormat::none) {
    planes[worker]->serve({.kind = RequestKind::pull_rows,
                           .id = id,
                           .variable = table.value,
                           .step = step,
                           .value_format = value_format,
                           .ids = ids_bytes(ids)});
    io.drain();
  }
  ShardStats stats() {
    ShardStats out;
    shard.stats([&](ShardStats s) { out = std::move(s); });
    io.drain();
    return out;
  }
};

const Error& error_of(const Answer* answer) {
  REQUIRE(answer != nullptr);
  REQUIRE(answer->kind == AnswerKind::error);
  REQUIRE(answer->error);
  return *answer->error;
}

}  // namespace

TEST_CASE("a push of rows is decoded, applied to its ids and answered by a receipt") {
  RowsFixture f(Mode::async, 1);
  f.push(0, 1, 1, {7, 3}, {1, 2, 3, 4});
  const Answer* receipt = f.writers[0].answer(1);
  REQUIRE(receipt != nullptr);
  CHECK(receipt->kind == AnswerKind::receipt);
  f.pull(0, 2, 1, {3, 7, 3, 50});
  const Answer* rows = f.writers[0].answer(2);
  REQUIRE(rows != nullptr);
  CHECK(rows->kind == AnswerKind::value);
  CHECK(rows->applied_step == Step(1));
  CHECK(f.writers[0].floats(2) == std::vector<float>{-3, -4, -1, -2, -3, -4, 0, 0});
  const ShardStats stats = f.stats();
  REQUIRE(stats.table_stats.size() == 1);
  CHECK(stats.table_stats[0].rows_pushed == 2);
  CHECK(stats.table_stats[0].rows_pulled == 4);
}

TEST_CASE("rows travel narrowed both ways where the request says") {
  RowsFixture f(Mode::async, 1);
  f.push(0, 1, 1, {5}, {0.5f, -2}, WireFormat::bf16);
  f.pull(0, 2, 1, {5}, WireFormat::bf16);
  const Answer* rows = f.writers[0].answer(2);
  REQUIRE(rows != nullptr);
  CHECK(rows->format == WireFormat::bf16);
  REQUIRE(f.writers[0].bytes.back().size() == 4);  // two bf16
  std::vector<float> widened(2);
  decode(WireFormat::bf16, DType::float32, f.writers[0].bytes.back(),
         std::as_writable_bytes(std::span(widened)));
  CHECK(widened == std::vector<float>{-0.5f, 2});
}

TEST_CASE("bad rows are refused naming the table and the id, and nothing applies") {
  RowsFixture f(Mode::async, 1);
  f.push(0, 1, 1, {3, 100}, {1, 1, 1, 1});
  const Error& past = error_of(f.writers[0].answer(1));
  CHECK(past.code() == ErrorCode::offset_out_of_range);
  CHECK(std::string(past.what()).find("id 100") != std::string::npos);
  CHECK(std::string(past.what()).find("table 'emb'") != std::string::npos);
  f.push(0, 2, 1, {3}, {1, 1, 1});  // a row and a half
  CHECK(error_of(f.writers[0].answer(2)).code() == ErrorCode::shape_mismatch);
  f.pull(0, 3, 0, {3});
  CHECK(f.writers[0].floats(3) == std::vector<float>{0, 0});
  // A rows request naming a dense variable's id, and a dense push naming the table's.
  VariableSpec dense{.name = "w", .shape = {2}};
  std::vector<float> init{1, 2};
  f.shard.register_variable(dense, {0, 2}, std::as_bytes(std::span(init)), [](auto&&) {});
  f.io.drain();
  f.planes[0]->serve({.kind = RequestKind::pull_rows, .id = 4, .variable = 1, .ids = {}});
  f.planes[0]->serve({.kind = RequestKind::push,
                      .id = 5,
                      .variable = f.table.value,
                      .step = 1,
                      .gradient = f.keep(std::vector<std::byte>(8))});
  f.io.drain();
  CHECK(error_of(f.writers[0].answer(4)).code() == ErrorCode::unknown_variable);
  CHECK(error_of(f.writers[0].answer(5)).code() == ErrorCode::unknown_variable);
}

TEST_CASE("sync: a push of the step after the one under way is held, then taken as it closes") {
  RowsFixture f(Mode::sync, 2, 2);
  f.push(0, 1, 1, {4}, {2, 2});
  f.push(0, 2, 2, {4}, {4, 4});  // step 1 waits for worker 1: step 2 is held
  CHECK(f.writers[0].answer(1) != nullptr);
  CHECK(f.writers[0].answer(2) == nullptr);
  CHECK(f.stats().pushes_held == 1);
  // The held push counts among the connection's polls (limits.max_waiting_polls = 2).
  f.pull(0, 3, 1, {4});
  f.pull(0, 4, 1, {4});
  const Error& full = error_of(f.writers[0].answer(4));
  CHECK(full.code() == ErrorCode::overloaded);
  CHECK(std::string(full.what()).find("limits.max_waiting_polls") != std::string::npos);
  // Worker 1's step 1 closes it: worker 0's pull of step 1 is answered, its step 2 taken.
  f.push(1, 1, 1, {}, {});
  const Answer* taken = f.writers[0].answer(2);
  REQUIRE(taken != nullptr);
  CHECK(taken->kind == AnswerKind::receipt);
  CHECK(f.writers[0].floats(3) == std::vector<float>{-1, -1});  // mean of 2 and 0
  // Step 2 waits for worker 1 now; once it pushes, the mean of 4 and 0 applies.
  f.push(1, 2, 2, {}, {});
  f.pull(0, 5, 2, {4});
  CHECK(f.writers[0].floats(5) == std::vector<float>{-3, -3});
  // Two steps after the one under way (3) is still refused.
  f.push(0, 6, 5, {}, {});
  CHECK(error_of(f.writers[0].answer(6)).code() == ErrorCode::step_from_future);
}

TEST_CASE("a held push is failed when the shard stops, and its receipt never comes twice") {
  RowsFixture f(Mode::sync, 2);
  f.push(0, 1, 1, {}, {});
  f.push(0, 2, 2, {}, {});
  bool stopped = false;
  f.shard.shut_down([&] { stopped = true; });
  f.io.drain();
  REQUIRE(stopped);
  CHECK(error_of(f.writers[0].answer(2)).code() == ErrorCode::disconnected);
  f.push(1, 1, 1, {}, {});
  size_t answers_to_2 = 0;
  for (const Answer& a : f.writers[0].taken) answers_to_2 += a.id == 2;
  CHECK(answers_to_2 == 1);
}
