// SPDX-License-Identifier: Apache-2.0
// psched-row-table-bench: what a shard's embedding table (actors/shard/row_table.h) costs in
// memory beside what it holds, and how fast it creates and updates rows, on one core.
//   psched-row-table-bench [--rows N] [--dim D] [--optimizer adagrad] [--dtype float32]
//                          [--max-rows M] [--admit-after A]
//   psched-row-table-bench --sweep [--rows N]
// --max-rows, --admit-after: the table's capacity (actors/shard/row_capacity.h); with M < N the
// first touches evict, and the table holds M rows at the end.
// --sweep: the update rate of every row optimizer at dims 16, 64 and 256 (float32), as rows a
// second and as the bytes an update moves (the row's value and state read and written, its
// gradient read) against memcpy's read and write rate on this machine, measured in the same run.
// Fills a table with N rows (each id once, in a random order, as first pushes create them),
// then updates them all again in random batches of --batch ids. Reports the bytes a row costs
// three ways: the table's own count (RowTable::bytes_held), the heap glibc reports before and
// after, and the payload (the row's values and optimizer state), with their ratio; and rows a
// second for the first touch (index insert, initial value, update) and for updates.
// Every rate, memcpy's too, is per second of the bench thread's CPU time
// (bench/heap_clock.h): on a machine whose cores other processes share, a wall clock would
// count their turns on the core as the table's time (while memcpy's best of five short copies
// mostly misses them), so the ratio would measure the neighbours.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/shard/row_table.h"
#include "bench/heap_clock.h"
#include "common/error.h"

namespace {

using psched::bench::heap_bytes;
using psched::bench::thread_cpu_seconds;

// Applies the rows `ids` in batches of `batch`, each with a gradient of small values; returns
// the CPU seconds it took.
double apply_all(psched::RowTable& table, const std::vector<uint64_t>& ids, size_t batch,
                 uint64_t t) {
  const psched::TableSpec& spec = table.spec();
  std::vector<std::byte> gradients(batch * spec.row_bytes());
  std::mt19937 random(static_cast<uint32_t>(t));
  for (size_t k = 0; k < gradients.size(); k += 4)
    gradients[k] = static_cast<std::byte>(random() % 64);  // finite, small in either dtype
  const double start = thread_cpu_seconds();
  for (size_t at = 0; at < ids.size(); at += batch) {
    const size_t n = std::min(batch, ids.size() - at);
    table.apply({ids.data() + at, n}, {gradients.data(), n * spec.row_bytes()}, t);
  }
  return thread_cpu_seconds() - start;
}

// Bytes a CPU second memcpy reads and writes together, over buffers far larger than the caches.
double memcpy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<std::byte> from(bytes, std::byte{1}), to(bytes);
  double best = 0;
  for (int k = 0; k < 5; ++k) {
    const double start = thread_cpu_seconds();
    std::memcpy(to.data(), from.data(), bytes);
    best = std::max(best, 2.0 * double(bytes) / (thread_cpu_seconds() - start));
  }
  return best;
}

// Updates a second of a table of `rows` rows of `dim` float32 under `kind`, each row once a pass.
double update_rate(psched::optim::RowOptimizerKind kind, uint32_t dim, uint64_t rows,
                   size_t batch) {
  psched::TableSpec spec{.name = "bench", .num_embeddings = rows, .dim = dim};
  spec.optimizer = psched::optim::torch_row_defaults(kind);
  psched::RowTable table(spec);
  std::vector<uint64_t> ids(rows);
  for (uint64_t k = 0; k < rows; ++k) ids[k] = k;
  std::mt19937_64 random(1);
  std::shuffle(ids.begin(), ids.end(), random);
  apply_all(table, ids, batch, 1);  // first touch
  std::shuffle(ids.begin(), ids.end(), random);
  return double(rows) / apply_all(table, ids, batch, 2);
}

int sweep(uint64_t rows, size_t batch) {
  const double bandwidth = memcpy_bandwidth();
  std::printf("memcpy on this machine: %.1f GB/s read and written together (per CPU second)\n",
              bandwidth / 1e9);
  std::printf("%-16s %5s %12s %14s %12s\n", "optimizer", "dim", "M rows/s", "GB/s moved",
              "of memcpy");
  for (auto kind : {psched::optim::RowOptimizerKind::sgd, psched::optim::RowOptimizerKind::adagrad,
                    psched::optim::RowOptimizerKind::rowwise_adagrad,
                    psched::optim::RowOptimizerKind::sparse_adam}) {
    for (uint32_t dim : {16u, 64u, 256u}) {
      const psched::optim::RowOptimizerSpec spec = psched::optim::torch_row_defaults(kind);
      const double block = 4.0 * double(dim + psched::optim::row_state_elements(spec, dim));
      const double rate = update_rate(kind, dim, rows, batch);
      const double moved = rate * (2 * block + 4.0 * dim);  // value, state both ways; gradient
      std::printf("%-16s %5u %12.2f %14.2f %11.0f%%\n",
                  std::string(psched::optim::to_string(kind)).c_str(), dim, rate / 1e6, moved / 1e9,
                  100 * moved / bandwidth);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-row-table-bench: an embedding table's memory per row and its apply rate"};
  uint64_t rows = 10'000'000;
  uint32_t dim = 64;
  size_t batch = 4096;
  std::string optimizer = "adagrad", dtype = "float32";
  bool sweeping = false;
  uint64_t max_rows = 0;
  uint32_t admit_after = 0;
  app.add_option("--rows", rows, "rows stored");
  app.add_option("--max-rows", max_rows, "the table's max_rows (0: no bound)");
  app.add_option("--admit-after", admit_after, "the table's admit_after");
  app.add_option("--dim", dim, "elements per row");
  app.add_option("--batch", batch, "ids per apply (a push's rows)");
  app.add_option("--optimizer", optimizer, "sgd, adagrad, rowwise_adagrad or sparse_adam");
  app.add_option("--dtype", dtype, "float32 or float64");
  app.add_flag("--sweep", sweeping, "every row optimizer at dims 16, 64, 256 against memcpy");
  CLI11_PARSE(app, argc, argv);
  if (sweeping) return sweep(rows, batch);
  psched::TableSpec spec{.name = "bench", .num_embeddings = rows * 4, .dim = dim};
  spec.dtype = dtype == "float64" ? psched::DType::float64 : psched::DType::float32;
  psched::optim::RowOptimizerKind kind;
  if (!psched::optim::parse_row_optimizer_kind(optimizer, kind)) {
    std::fprintf(stderr, "unknown optimizer '%s'\n", optimizer.c_str());
    return 2;
  }
  spec.optimizer = psched::optim::torch_row_defaults(kind);
  spec.init = {psched::RowInit::Kind::uniform, -0.01, 0.01};
  spec.max_rows = max_rows;
  spec.admit_after = admit_after;
  psched::RowTable::check_spec(spec);

  std::vector<uint64_t> ids(rows);
  std::mt19937_64 random(1);
  for (uint64_t k = 0; k < rows; ++k) ids[k] = 4 * k + random() % 4;  // each once, spread
  std::shuffle(ids.begin(), ids.end(), random);
  const size_t heap_before = heap_bytes();
  psched::RowTable table(spec);
  const double created = apply_all(table, ids, batch, 1);
  const size_t heap = heap_bytes() - heap_before;
  std::shuffle(ids.begin(), ids.end(), random);
  const double updated = apply_all(table, ids, batch, 2);

  const double n = double(table.rows()), payload = double(table.payload_bytes()) / n;
  std::printf("%s %s dim %u: %.0f rows, payload %.1f B a row", optimizer.c_str(), dtype.c_str(),
              dim, n, payload);
  if (max_rows || admit_after > 1)
    std::printf(" (max_rows %llu, admit_after %u: %llu evicted, %llu updates dropped)",
                static_cast<unsigned long long>(max_rows), admit_after,
                static_cast<unsigned long long>(table.capacity().evictions()),
                static_cast<unsigned long long>(table.capacity().dropped()));
  std::printf("\n");
  std::printf("  held by the table   %.1f B a row (%.3fx payload)\n", table.bytes_held() / n,
              table.bytes_held() / n / payload);
  std::printf("  heap grown by       %.1f B a row (%.3fx payload)\n", heap / n, heap / n / payload);
  std::printf("  first touch         %.2f M rows/s\n", ids.size() / created / 1e6);
  std::printf("  update              %.2f M rows/s (%.0f MB/s of values and state)\n",
              ids.size() / updated / 1e6, ids.size() * payload / updated / 1e6);
  return 0;
}
