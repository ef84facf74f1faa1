// SPDX-License-Identifier: Apache-2.0
// RowTable on its own: rows made on first update from their initial value, a function of the
// table's seed and the id; duplicates summed into one update; bad ids and widths refused; a
// table streamed as a checkpoint streams it restored equal.
#include "actors/shard/row_table.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "common/error_test_support.h"

using namespace psched;
using psched::testing::code_of;

namespace {

// Table "emb" of `rows` rows of `dim` float64 elements under `kind` (torch's defaults).
TableSpec spec_of(uint64_t rows, uint32_t dim, optim::RowOptimizerKind kind, RowInit init = {}) {
  return {.name = "emb",
          .num_embeddings = rows,
          .dim = dim,
          .dtype = DType::float64,
          .priority = Priority(0),
          .optimizer = optim::torch_row_defaults(kind),
          .init = init,
          .seed = 7};
}

std::span<const std::byte> bytes_of(const std::vector<double>& v) {
  return std::as_bytes(std::span(v));
}

std::vector<double> read(const RowTable& table, const std::vector<uint64_t>& ids) {
  std::vector<double> out(ids.size() * table.spec().dim);
  table.read(ids, std::as_writable_bytes(std::span(out)));
  return out;
}

// The table as a checkpoint streams it: its head, then its rows (save_head, freeze, save_chunk).
struct Saved {
  std::vector<std::byte> head, rows;
};
Saved save(RowTable& table) {
  Saved saved;
  ByteWriter head;
  table.save_head(head);
  saved.head = std::move(head.bytes());
  saved.rows.resize(table.freeze(0, [&](uint64_t offset, std::vector<std::byte> chunk) {
    REQUIRE(offset + chunk.size() <= saved.rows.size());
    std::memcpy(saved.rows.data() + offset, chunk.data(), chunk.size());
  }));
  while (table.save_chunk()) {
  }
  return saved;
}
// The table save() saved, with the head's and the rows' bytes cut by `cut_head`, `cut_rows`.
RowTable restore(const Saved& saved, size_t cut_head = 0, size_t cut_rows = 0) {
  ByteReader head(std::span(saved.head).first(saved.head.size() - cut_head), "saved head");
  ByteReader rows(std::span(saved.rows).first(saved.rows.size() - cut_rows), "saved rows");
  ReaderSource source(rows);
  RowTable table = RowTable::restore(head, source);
  CHECK(head.done());
  CHECK(rows.done());
  return table;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-15));
}

}  // namespace

TEST_CASE("duplicates of an id are summed into one update, as torch coalesces them") {
  // torch: nn.Parameter(torch.zeros(6, 2, dtype=float64)), Adagrad(lr=0.5), three steps of
  // sparse gradients with these ids and rows (row 4 twice in the first).
  TableSpec spec = spec_of(6, 2, optim::RowOptimizerKind::adagrad);
  spec.optimizer.lr = 0.5;
  RowTable table(spec);
  table.apply(std::vector<uint64_t>{4, 1, 4}, bytes_of({1, 2, 3, 4, 5, 6}), 1);
  table.apply(std::vector<uint64_t>{1, 5}, bytes_of({-1, 0.5, 2, 2}), 2);
  table.apply(std::vector<uint64_t>{4}, bytes_of({0.25, -0.75}), 3);
  check_close(read(table, {1, 4, 5}),
              {-0.34188611697991433, -0.56201736728056573, -0.52081527234741076,
               -0.4533296456478017, -0.499999999975, -0.499999999975});
  CHECK(table.rows() == 3);
  CHECK(read(table, {0, 2}) == std::vector<double>(4, 0.0));  // never updated: initial
  CHECK(table.rows() == 3);                                   // and reading stored nothing
}

TEST_CASE("a row's first value depends on the seed and its id only") {
  const RowInit uniform{RowInit::Kind::uniform, -0.5, 0.25};
  RowTable a(spec_of(1000, 8, optim::RowOptimizerKind::sgd, uniform));
  RowTable b(spec_of(1000, 8, optim::RowOptimizerKind::sgd, uniform));
  std::vector<double> g(8, 1.0);
  b.apply(std::vector<uint64_t>{900}, bytes_of(g), 1);  // b stores rows in another order
  std::vector<double> forward = read(a, {3, 17, 999}), backward = read(b, {999, 17, 3});
  for (size_t j = 0; j < 8; ++j) {
    CHECK(forward[j] == backward[16 + j]);
    CHECK(forward[8 + j] == backward[8 + j]);
    CHECK(forward[16 + j] == backward[j]);
  }
  for (double x : forward) CHECK((x >= -0.5 && x < 0.25));
  CHECK(forward[0] != forward[8]);  // rows differ
  TableSpec other = spec_of(1000, 8, optim::RowOptimizerKind::sgd, uniform);
  other.seed = 8;
  CHECK(read(RowTable(other), {3}) != std::vector<double>(forward.begin(), forward.begin() + 8));
}

TEST_CASE("normal and zero initial rows have the asked mean and spread") {
  RowTable normal(
      spec_of(1 << 20, 4, optim::RowOptimizerKind::sgd, {RowInit::Kind::normal, 1.0, 0.5}));
  std::vector<uint64_t> ids(20000);
  for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = i * 37;
  std::vector<double> values = read(normal, ids);
  double mean = 0, square = 0;
  for (double x : values) mean += x / double(values.size());
  for (double x : values) square += (x - mean) * (x - mean) / double(values.size());
  CHECK(mean == doctest::Approx(1.0).epsilon(0.01));
  CHECK(std::sqrt(square) == doctest::Approx(0.5).epsilon(0.02));
  RowTable zeros(spec_of(10, 4, optim::RowOptimizerKind::sgd));
  CHECK(read(zeros, {9}) == std::vector<double>(4, 0.0));
}

TEST_CASE("ids past the table, other dtypes and widths are refused naming table and id") {
  RowTable table(spec_of(10, 2, optim::RowOptimizerKind::sgd));
  std::vector<uint64_t> ids{3, 10};
  std::string message = testing::refusal(ErrorCode::offset_out_of_range, [&] {
    table.check_rows("push", ids, DType::float64, 4 * sizeof(double));
  });
  CHECK(message.find("table 'emb'") != std::string::npos);
  CHECK(message.find("id 10 is not below its 10 rows") != std::string::npos);
  CHECK(code_of([&] { table.check_rows("push", std::vector<uint64_t>{3}, DType::float32, 8); }) ==
        ErrorCode::dtype_mismatch);
  CHECK(code_of([&] {
          table.check_rows("pull", std::vector<uint64_t>{3}, DType::float64, 3 * sizeof(double));
        }) == ErrorCode::shape_mismatch);
  TableSpec bad = spec_of(10, 0, optim::RowOptimizerKind::sgd);
  CHECK(code_of([&] { RowTable::check_spec(bad); }) == ErrorCode::invalid_argument);
  bad = spec_of(10, 2, optim::RowOptimizerKind::sgd, {RowInit::Kind::uniform, 1, 1});
  CHECK(code_of([&] { RowTable::check_spec(bad); }) == ErrorCode::invalid_argument);
}

TEST_CASE("a saved table restores equal and trains on the same") {
  TableSpec spec =
      spec_of(100000, 3, optim::RowOptimizerKind::sparse_adam, {RowInit::Kind::uniform, -1, 1});
  RowTable original(spec);
  for (uint64_t t = 1; t <= 3; ++t)
    original.apply(std::vector<uint64_t>{t * 11, 5000 + t, 42},
                   bytes_of({0.1 * double(t), 0.2, 0.3, -1, 2, 0.5, 0.25, 0.75, -0.125}), t);
  const Saved saved = save(original);
  RowTable copy = restore(saved);
  CHECK(copy.rows() == original.rows());
  for (RowTable* table : {&original, &copy})
    table->apply(std::vector<uint64_t>{42, 77}, bytes_of({1, 1, 1, -1, -1, -1}), 4);
  const std::vector<uint64_t> ids{11, 22, 33, 42, 77, 5001, 5003, 99};
  CHECK(read(copy, ids) == read(original, ids));
  CHECK(code_of([&] { restore(saved, 0, 5); }) == ErrorCode::corrupt_checkpoint);
  CHECK(code_of([&] { restore(saved, 5, 0); }) == ErrorCode::corrupt_checkpoint);
}

TEST_CASE(
    "a frozen table streams every row as at the freeze, chunk by chunk, while updates go on") {
  TableSpec spec = spec_of(1'000'000, 2, optim::RowOptimizerKind::adagrad);
  RowTable table(spec);
  std::vector<uint64_t> ids(3 * RowTable::kRowsPerChunk - 100);  // three chunks, the last short
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = 7 * k;
  table.apply(ids, bytes_of(std::vector<double>(2 * ids.size(), 0.5)), 1);
  const std::vector<double> frozen = read(table, ids);
  ByteWriter head;
  table.save_head(head);
  std::vector<std::byte> stream;
  std::vector<int> written(3);
  const uint64_t bytes = table.freeze(100, [&](uint64_t offset, std::vector<std::byte> rows) {
    const uint64_t at = offset - 100;
    REQUIRE(at + rows.size() <= stream.size());
    std::memcpy(stream.data() + at, rows.data(), rows.size());
    ++written[at / (RowTable::kRowsPerChunk * 40)];  // a row: its id, value and sums
  });
  CHECK(bytes == ids.size() * (8 + 2 * 8 * 2));  // id, value, Adagrad's sums
  stream.resize(bytes);
  CHECK(table.save_chunk());  // chunk 0
  // Updates before the stream reached them: the last chunk's row is kept as it was, twice
  // updated; a new row is no part of the stream.
  table.apply(std::vector<uint64_t>{ids.back(), 1}, bytes_of({9, 9, 9, 9}), 2);
  table.apply(std::vector<uint64_t>{ids.back(), ids[5000]}, bytes_of({9, 9, 9, 9}), 3);
  CHECK(written == std::vector<int>{1, 0, 0});
  while (table.save_chunk()) {
  }
  CHECK(written == std::vector<int>{1, 1, 1});
  CHECK_FALSE(table.save_chunk());
  table.apply(std::vector<uint64_t>{ids[0]}, bytes_of({9, 9}), 4);  // no stream any more
  CHECK(written == std::vector<int>{1, 1, 1});
  ByteReader in(head.bytes(), "head"), streamed(stream, "stream");
  ReaderSource source(streamed);
  RowTable copy = RowTable::restore(in, source);
  CHECK(streamed.done());
  CHECK(copy.rows() == ids.size());
  CHECK(read(copy, ids) == frozen);
}

TEST_CASE("memory held grows a chunk of rows at a time") {
  RowTable table(spec_of(1 << 20, 16, optim::RowOptimizerKind::adagrad));
  CHECK(table.bytes_held() == 0);
  std::vector<double> g(16, 1.0);
  table.apply(std::vector<uint64_t>{5}, bytes_of(g), 1);
  const uint64_t one_chunk = RowTable::kRowsPerChunk * 16 * 2 * sizeof(double);
  CHECK(table.bytes_held() >= one_chunk);
  CHECK(table.bytes_held() < one_chunk + 1024);
}

TEST_CASE("growth_bytes counts the index's doubling past 3/4 full, as bytes_held then shows") {
  RowTable table(spec_of(1 << 20, 4, optim::RowOptimizerKind::sgd));
  std::vector<uint64_t> ids(12);
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  table.apply(ids, bytes_of(std::vector<double>(12 * 4, 1.0)), 1);  // 12 rows: 16 entries full
  const uint64_t entry = 16, id = sizeof(uint64_t);
  CHECK(table.growth_bytes(std::vector<uint64_t>{3, 7}) == 0);  // stored already
  // A 13th row: its id in the slot list, and the index from 16 entries to 32.
  CHECK(table.growth_bytes(std::vector<uint64_t>{100}) == id + 16 * entry);
  const uint64_t held = table.bytes_held();
  table.apply(std::vector<uint64_t>{100}, bytes_of(std::vector<double>(4, 1.0)), 2);
  CHECK(table.bytes_held() - held >= 16 * entry);
  CHECK(table.growth_bytes(std::vector<uint64_t>{101}) == id);
}

namespace {

// A table and a step track of its own, taking pushes as a shard's step machine and the table
// do: the table kind's sync and async rules without a shard.
struct TrackedTable {
  RowTable table;
  StepTrack track;

  TrackedTable(const TableSpec& spec, Mode mode, uint32_t workers)
      : table(spec), track(spec.name, table.extent(), mode, workers, nullptr) {}
  // Worker `worker`'s push of step `step`: rows `ids`, gradients `g`.
  void push(uint32_t worker, Step step, std::vector<uint64_t> ids, const std::vector<double>& g) {
    const Push push{.worker = WorkerId(worker),
                    .step = step,
                    .dtype = DType::float64,
                    .data = bytes_of(g),
                    .rows = true,
                    .ids = ids};
    const ElementRange units = table.check_push(push);
    REQUIRE_FALSE(track.is_duplicate(WorkerId(worker), step, units));
    table.take(track.receive(WorkerId(worker), step, units), push);
  }
};

}  // namespace

TEST_CASE("sync: a step applies the mean over the workers once all pushed, untouched as zero") {
  TableSpec spec = spec_of(100, 1, optim::RowOptimizerKind::sgd);
  spec.optimizer.lr = 1;
  TrackedTable t(spec, Mode::sync, 2);
  t.push(0, Step(1), {1, 2, 1}, {1, 2, 3});  // 1 twice: 4
  CHECK(read(t.table, {1, 2, 3}) == std::vector<double>{0, 0, 0});
  CHECK(t.track.not_yet_applied(WorkerId(0), Step(1), t.table.extent()).ranges() ==
        std::vector<ElementRange>{{0, 1}});
  t.push(1, Step(1), {2, 3}, {10, 6});  // 1: (4 + 0) / 2, 2: (2 + 10) / 2, 3: (0 + 6) / 2
  CHECK(read(t.table, {1, 2, 3}) == std::vector<double>{-2, -6, -3});
  CHECK(t.track.applied_step(WorkerId(0)) == Step(1));
}

TEST_CASE("async: a push's rows apply at once, numbered by the worker's step") {
  TableSpec spec = spec_of(50, 2, optim::RowOptimizerKind::sparse_adam);
  TrackedTable tracked(spec, Mode::async, 2);
  RowTable reference(spec);
  const std::vector<uint64_t> ids{4, 9};
  tracked.push(1, Step(1), {4, 9}, {1, 2, 3, 4});
  reference.apply(ids, bytes_of({1, 2, 3, 4}), 1);
  CHECK(read(tracked.table, ids) == read(reference, ids));
  tracked.push(0, Step(1), {4}, {5, 6});  // worker 0's step 1: update number 2
  reference.apply(std::vector<uint64_t>{4}, bytes_of({5, 6}), 2);
  CHECK(read(tracked.table, ids) == read(reference, ids));
}

TEST_CASE("a table refuses a push or a poll of a range, as a variable refuses rows") {
  RowTable table(spec_of(100, 1, optim::RowOptimizerKind::sgd));
  const std::vector<double> g{1};
  const Push range{.worker = WorkerId(0),
                   .variable = VariableId(3),
                   .step = Step(1),
                   .range = {0, 1},
                   .dtype = DType::float64,
                   .data = bytes_of(g)};
  const std::string message =
      testing::refusal(ErrorCode::unknown_variable, [&] { table.check_push(range); });
  CHECK(message.find("id 3 is table 'emb'") != std::string::npos);
  const Poll poll{WorkerId(0), VariableId(3), Step(1), {0, 1}, PollTicket(1)};
  CHECK(code_of([&] { table.check_poll("poll", poll); }) == ErrorCode::unknown_variable);
}

TEST_CASE("a sync step's gathered sums survive a save; a timeout applies what was gathered") {
  TableSpec spec = spec_of(100, 1, optim::RowOptimizerKind::sgd);
  spec.optimizer.lr = 1;
  TrackedTable t(spec, Mode::sync, 3);
  t.push(0, Step(1), {7, 9}, {3, 4});
  t.push(1, Step(1), {7}, {5});
  ByteWriter out;
  t.table.save_sums(out);
  RowTable copy(spec);
  ByteReader in(out.bytes(), "sums");
  copy.load_sums(in);
  CHECK(in.done());
  StepUpdate closed = t.track.complete_without_missing();  // worker 2 never pushed
  for (RowTable* table : {&t.table, &copy}) {
    table->apply_gathered(closed);
    CHECK(read(*table, {7, 9}) == std::vector<double>{-4, -2});  // means over the 2 who pushed
  }
}

// Capacity (actors/shard/row_capacity.h): max_rows and admit_after.

namespace {

TableSpec bounded_spec(uint64_t max_rows, uint32_t admit_after) {
  TableSpec spec =
      spec_of(1000, 2, optim::RowOptimizerKind::adagrad, {RowInit::Kind::uniform, -1, 1});
  spec.max_rows = max_rows;
  spec.admit_after = admit_after;
  return spec;
}

// One update of each of `ids` (gradient 1 everywhere) as update `t`.
void touch(RowTable& table, std::vector<uint64_t> ids, uint64_t t) {
  table.apply(ids, bytes_of(std::vector<double>(2 * ids.size(), 1.0)), t);
}

}  // namespace

TEST_CASE("at max_rows the least recently updated row is evicted and comes back from its start") {
  RowTable table(bounded_spec(3, 0));
  RowTable unbounded(
      spec_of(1000, 2, optim::RowOptimizerKind::adagrad, {RowInit::Kind::uniform, -1, 1}));
  const std::vector<double> initial = read(table, {1, 2, 3, 4});
  touch(table, {1, 2, 3}, 1);
  touch(table, {1}, 2);  // 2 is now the least recently updated
  const uint64_t held = table.bytes_held();
  touch(table, {4}, 3);
  CHECK(table.rows() == 3);
  CHECK(table.capacity().evictions() == 1);
  CHECK(table.bytes_held() == held);
  CHECK(read(table, {2}) == std::vector<double>(initial.begin() + 2, initial.begin() + 4));
  touch(unbounded, {1, 2, 3}, 1);
  touch(unbounded, {1}, 2);
  touch(unbounded, {4}, 3);
  CHECK(read(table, {1, 3, 4}) == read(unbounded, {1, 3, 4}));  // the rest as without a bound
  touch(table, {2}, 4);  // back from its initial value, with fresh Adagrad sums; 3 goes
  RowTable fresh(bounded_spec(3, 0));
  touch(fresh, {2}, 4);
  CHECK(read(table, {2}) == read(fresh, {2}));
  CHECK(read(table, {3}) == std::vector<double>(initial.begin() + 4, initial.begin() + 6));
  CHECK(table.capacity().evictions() == 2);
}

TEST_CASE("admit_after: a row is stored from its n-th update, the ones before dropped") {
  RowTable table(bounded_spec(0, 3));
  const std::vector<double> initial = read(table, {7});
  touch(table, {7}, 1);
  touch(table, {7, 8}, 2);
  CHECK(table.rows() == 0);
  CHECK(table.capacity().dropped() == 3);
  CHECK(read(table, {7}) == initial);
  touch(table, {7}, 3);  // its third: stored, this update applied as a first
  CHECK(table.rows() == 1);
  RowTable once(bounded_spec(0, 0));
  touch(once, {7}, 3);
  CHECK(read(table, {7}) == read(once, {7}));
  TableSpec bad = bounded_spec(0, RowCapacity::kMaxAdmitAfter + 1);
  CHECK(code_of([&] { RowTable::check_spec(bad); }) == ErrorCode::invalid_argument);
}

TEST_CASE("a restored bounded table evicts and admits as the original goes on doing") {
  RowTable original(bounded_spec(4, 2));
  for (uint64_t t = 1; t <= 12; ++t) touch(original, {t % 7, (3 * t) % 11, 5}, t);
  RowTable copy = restore(save(original));
  for (uint64_t t = 13; t <= 30; ++t)
    for (RowTable* table : {&original, &copy}) touch(*table, {t % 7, (5 * t) % 13, t % 3}, t);
  std::vector<uint64_t> all(20);
  std::iota(all.begin(), all.end(), 0);
  CHECK(copy.rows() == original.rows());
  CHECK(copy.capacity().evictions() == original.capacity().evictions());
  CHECK(copy.capacity().dropped() == original.capacity().dropped());
  CHECK(read(copy, all) == read(original, all));
  CHECK(original.capacity().evictions() > 0);
  CHECK(original.capacity().dropped() > 0);
}

TEST_CASE("a frozen row evicted before its chunk went streams as it was at the freeze") {
  RowTable table(bounded_spec(5, 0));
  touch(table, {10, 11, 12, 13, 14}, 1);
  ByteWriter head;
  table.save_head(head);
  const std::vector<uint64_t> frozen_ids{10, 11, 12, 13, 14};
  const std::vector<double> frozen = read(table, frozen_ids);
  std::vector<std::byte> stream(table.freeze(0, [&](uint64_t offset, std::vector<std::byte> rows) {
    std::memcpy(stream.data() + offset, rows.data(), rows.size());
  }));
  touch(table, {20, 21, 11}, 2);  // evicts 10 and 12 (their slots go to 20 and 21)
  CHECK(table.capacity().evictions() == 2);
  while (table.save_chunk()) {
  }
  ByteReader in(head.bytes(), "head"), streamed(stream, "stream");
  ReaderSource source(streamed);
  RowTable copy = RowTable::restore(in, source);
  CHECK(copy.rows() == 5);
  CHECK(read(copy, frozen_ids) == frozen);
  touch(copy, {20}, 2);  // the restored order: 10 is the least recent, as at the freeze
  CHECK(read(copy, {10}) == read(RowTable(bounded_spec(5, 0)), {10}));
}
