// SPDX-License-Identifier: Apache-2.0
// psched-table-checkpoint-bench: what checkpointing a large embedding table costs a shard
// (actors/durability/shard_durability.h streams it), in two runs of the program:
//
//   psched-table-checkpoint-bench --dir DIR [--rows N] [--dim D]
//       fills a shard's table with N rows (Adagrad, float32), then takes a checkpoint while the
//       shard goes on taking pushes of rows, and reports the checkpoint's time, the longest the
//       shard's loop went without running a waiting task during it (its pause), and the
//       process's memory before and at most during it;
//   psched-table-checkpoint-bench --dir DIR --restore
//       restores that shard in a fresh process and reports the time and peak memory.
//
// The fill goes in before the shard's first restore, so that it is not in the update log (the
// restore then writes the first checkpoint whole, on the loop: reported too).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_loop_support.h"
#include "actors/shard/variable_shard.h"
#include "bench/heap_clock.h"

namespace {

using psched::bench::Clock;
using psched::bench::seconds_since;

// The process's resident memory now and at most so far, in MiB (/proc/self/status).
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field + ":")) return std::stod(line.substr(field.size() + 1)) / 1024;
  return 0;
}

// The id of the table's k-th row: spread over four times as many ids.
uint64_t row_id(uint64_t k) {
  return 4 * k + psched::mix64(k) % 4;
}

psched::TableSpec table_spec(uint64_t rows, uint32_t dim) {
  psched::TableSpec spec;
  spec.name = "bench";
  spec.num_embeddings = 4 * rows;
  spec.dim = dim;
  spec.optimizer = psched::optim::torch_row_defaults(psched::optim::RowOptimizerKind::adagrad);
  return spec;
}

// An async shard 0 for one worker, its checkpoints and log in `dir`.
psched::ShardSettings settings(const std::string& dir) {
  psched::ShardSettings settings;
  settings.max_variables = 16;
  settings.checkpoint_directory = dir;
  return settings;
}

// Pushes of `batch` rows each, one step each, worker 0.
struct Pusher {
  psched::VariableShard& shard;
  psched::VariableId table;
  uint32_t dim;
  uint64_t step = 0;
  std::vector<float> gradients = {};

  void push(const std::vector<uint64_t>& ids) {
    gradients.assign(ids.size() * dim, 0.01f);
    shard.push({.worker = psched::WorkerId(0),
                .variable = table,
                .step = psched::Step(++step),
                .data = std::as_bytes(std::span(gradients)),
                .rows = true,
                .ids = ids},
               [](const psched::Result<>& taken) {
                 if (!taken) throw taken.error();
               });
  }
};

// Takes a checkpoint, calling `push` (when given) whenever the loop is free meanwhile, and
// reports it.
void checkpoint(psched::testing::TestLoop& io, psched::VariableShard& shard,
                const std::function<double()>& push, double push_alone, const char* what) {
  const double rss_before = status_mib("VmRSS");
  double rss_peak = rss_before, turn = 0, push_during = 0;
  bool done = false;
  const auto start = Clock::now();
  shard.checkpoint([&](std::exception_ptr error, std::filesystem::path) {
    if (error) std::rethrow_exception(error);
    done = true;
  });
  uint64_t pushes = 0;
  // Another thread posts a probe every millisecond, as requests arrive: the longest a probe
  // waits for the loop is the longest the shard leaves a request waiting.
  std::atomic<bool> probing{true};
  std::atomic<int64_t> longest_wait_ns{0};
  std::thread prober([&] {
    while (probing) {
      const auto posted = Clock::now();
      io.actors.post([&longest_wait_ns, posted] {
        const int64_t waited = (Clock::now() - posted) / std::chrono::nanoseconds(1);
        int64_t seen = longest_wait_ns.load();
        while (waited > seen && !longest_wait_ns.compare_exchange_weak(seen, waited)) {
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  while (!done) {
    io.scope.poll();
    if (push) {
      push_during = std::max(push_during, push());
      ++pushes;
    }
    rss_peak = std::max(rss_peak, status_mib("VmRSS"));
    if (!push) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  probing = false;
  prober.join();
  io.drain();
  turn = double(longest_wait_ns.load()) * 1e-9;
  std::printf(
      "streamed checkpoint %s: %.1f s; a task posted to the loop waited at most %.1f ms; RSS %.0f "
      "MiB "
      "before, at most %.0f during (+%.0f)\n",
      what, seconds_since(start), turn * 1e3, rss_before, rss_peak, rss_peak - rss_before);
  if (push)
    std::printf("  %llu pushes meanwhile, the slowest %.1f ms (without a checkpoint %.1f ms)\n",
                static_cast<unsigned long long>(pushes), push_during * 1e3, push_alone * 1e3);
}

int fill_and_checkpoint(const std::string& dir, uint64_t rows, uint32_t dim) {
  psched::testing::TestLoop io;
  psched::VariableShard shard(io.actors, settings(dir));
  psched::VariableId table;
  shard.register_table(
      table_spec(rows, dim),
      [&](const psched::Result<psched::VariableShard::Registration>& r) { table = r->id; });
  io.drain();
  Pusher pusher{shard, table, dim};
  std::mt19937_64 random(1);
  std::vector<uint64_t> ids;
  auto start = Clock::now();
  for (uint64_t k = 0; k < rows; ++k) {
    ids.push_back(row_id(k));
    if (ids.size() == 4096 || k + 1 == rows) {
      pusher.push(ids);
      ids.clear();
    }
  }
  io.drain();
  std::printf("fill: %llu rows of %u in %.1f s; RSS %.0f MiB\n",
              static_cast<unsigned long long>(rows), dim, seconds_since(start),
              status_mib("VmRSS"));
  start = Clock::now();
  psched::testing::restored(io, shard);  // writes the first checkpoint whole
  std::printf("first checkpoint (whole, on the loop): %.1f s\n", seconds_since(start));

  // Pushes of 4096 of the table's rows anywhere in it, timed: without a checkpoint, then during
  // one.
  ids.assign(4096, 0);
  auto timed_push = [&] {
    for (uint64_t& id : ids) id = row_id(random() % rows);
    const auto begun = Clock::now();
    pusher.push(ids);
    return seconds_since(begun);
  };
  double push_alone = 0;
  for (int k = 0; k < 50; ++k) push_alone = std::max(push_alone, timed_push());
  io.drain();

  checkpoint(
      io, shard, [&] { return timed_push(); }, push_alone, "with pushes of 4096 rows");
  // Again with no pushes: the restore run then replays no log.
  checkpoint(io, shard, nullptr, 0, "alone");
  return 0;
}

int restore(const std::string& dir) {
  psched::testing::TestLoop io;
  psched::VariableShard shard(io.actors, settings(dir));
  const auto start = Clock::now();
  psched::RestoreReport report = psched::testing::restored(io, shard);
  std::printf(
      "restore: %.1f s (%llu table(s), %llu logged updates replayed, a checkpoint "
      "written); RSS %.0f MiB, at most %.0f\n",
      seconds_since(start), static_cast<unsigned long long>(report.tables),
      static_cast<unsigned long long>(report.replayed), status_mib("VmRSS"), status_mib("VmHWM"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-table-checkpoint-bench: checkpointing and restoring a large table"};
  std::string dir;
  uint64_t rows = 10'000'000;
  uint32_t dim = 64;
  bool restoring = false;
  app.add_option("--dir", dir, "the shard's checkpoint directory")->required();
  app.add_option("--rows", rows, "rows in the table");
  app.add_option("--dim", dim, "elements per row");
  app.add_flag("--restore", restoring, "restore the shard DIR holds, in this process");
  CLI11_PARSE(app, argc, argv);
  return restoring ? restore(dir) : fill_and_checkpoint(dir, rows, dim);
}
