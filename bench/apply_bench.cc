// SPDX-License-Identifier: Apache-2.0
// psched-apply-bench: how fast a shard applies the optimizer (docs/design.md section 10;
// docs/benchmarks.md, docs/gpu.md). Every figure is set against a copy of the same bytes
// measured in the same run:
//   cpu rows  every optimizer: Variable::push on one thread and over the apply pool, against
//             memcpy of as many bytes as the apply reads and writes (bench/apply_cpu.h)
//   gpu rows  built with CUDA and run when a GPU is there (skip: --cpu-only): the shard's apply
//             on a `device: cuda:N` variable and the fused kernel, against the GPU's copy
//             bandwidths (bench/apply_gpu.h)
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/apply_cpu.h"
#include "common/error.h"
#include "common/log.h"
#include "config/byte_size.h"
#include "optim/optimizer.h"
#ifdef PSCHED_HAVE_CUDA
#include "bench/apply_gpu.h"
#endif

namespace psched::bench {
namespace {

struct Options {
  std::vector<std::string> sizes{"256KiB", "4MiB", "64MiB"};
  std::vector<std::string> optimizers{"sgd",     "momentum", "adam",   "adamw",
                                      "adam_tf", "adagrad",  "rmsprop"};
  CpuApplyOptions cpu;
  unsigned apply_helpers = std::max(1u, std::thread::hardware_concurrency()) - 1;
  std::string json;
  bool cpu_only = false;
  std::vector<std::string> gpu_sizes{"4MiB", "16MiB", "64MiB", "256MiB", "1GiB"};
  std::vector<std::string> gpu_optimizers{"adam", "sgd"};
  uint32_t device = 0;
};

std::vector<uint64_t> parse_sizes(const std::vector<std::string>& sizes) {
  std::vector<uint64_t> bytes;
  for (const std::string& size : sizes) {
    const std::optional<uint64_t> b = parse_byte_size(size);
    if (!b || *b < 4 || *b % 4 != 0)
      fail(ErrorCode::invalid_argument, "'{}' is no size of float32 elements", size);
    bytes.push_back(*b);
  }
  return bytes;
}

void check_optimizers(const char* option, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    optim::OptimizerKind kind;
    if (!optim::parse_optimizer_kind(name, kind))
      fail(ErrorCode::invalid_argument, "{}: unknown optimizer '{}'", option, name);
  }
}

nlohmann::json run_cpu(const Options& o, const std::vector<uint64_t>& sizes, ForkJoinPool& pool) {
  print_cpu_header(pool.width());
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& optimizer : o.optimizers) {
    for (uint64_t bytes : sizes) {
      const CpuApplyRow row = measure_cpu_apply(o.cpu, optimizer, bytes, pool);
      print_cpu_row(row);
      rows.push_back(to_json(row));
    }
  }
  return rows;
}

// The GPU rows where this build has them and a GPU is there; null otherwise.
nlohmann::json run_gpu(const Options& o, ForkJoinPool& pool) {
#ifdef PSCHED_HAVE_CUDA
  if (o.cpu_only) return nullptr;
  if (usable_gpu_count() == 0) {
    fmt::print("no CUDA device usable: no gpu rows\n");
    return nullptr;
  }
  fmt::print("\n");
  const GpuApplyOptions gpu{.optimizers = o.gpu_optimizers,
                            .sizes = parse_sizes(o.gpu_sizes),
                            .seconds = o.cpu.seconds,
                            .device = o.device};
  return run_gpu_apply(gpu, pool);
#else
  if (!o.cpu_only) fmt::print("built without CUDA: no gpu rows\n");
  return nullptr;
#endif
}

void write_json(const Options& o, unsigned pool_width, nlohmann::json cpu, nlohmann::json gpu) {
  const nlohmann::json doc = {{"benchmark", "apply"},
                              {"dtype", "float32"},
                              {"seconds_per_figure", o.cpu.seconds},
                              {"rounds", o.cpu.rounds},
                              {"hardware_threads", std::thread::hardware_concurrency()},
                              {"pool_threads", pool_width},
                              {"cpu", std::move(cpu)},
                              {"gpu", std::move(gpu)}};
  std::ofstream out(o.json);
  out << doc.dump(2) << "\n";
  if (!out) fail(ErrorCode::invalid_argument, "--json: cannot write '{}'", o.json);
}

int run(const Options& o) {
  set_log_level(LogLevel::warn);
  // Bad options fail before anything is measured.
  check_optimizers("--optimizers", o.optimizers);
  check_optimizers("--gpu-optimizers", o.gpu_optimizers);
  parse_sizes(o.gpu_sizes);
  const std::vector<uint64_t> sizes = parse_sizes(o.sizes);
  ForkJoinPool pool(o.apply_helpers);
  nlohmann::json cpu = run_cpu(o, sizes, pool);
  nlohmann::json gpu = run_gpu(o, pool);
  if (!o.json.empty()) write_json(o, pool.width(), std::move(cpu), std::move(gpu));
  return 0;
}

}  // namespace
}  // namespace psched::bench

int main(int argc, char** argv) {
  CLI::App app{
      "psched-apply-bench: optimizer apply GB/s on the CPU against a memory copy of the same "
      "bytes, and on a GPU (CUDA builds) against the GPU's copy bandwidths"};
  psched::bench::Options o;
  app.add_option("--sizes", o.sizes, "cpu rows: variable sizes, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--optimizers", o.optimizers, "cpu rows: optimizer kinds, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--seconds", o.cpu.seconds, "time budget per figure")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rounds", o.cpu.rounds,
                 "cpu rows: blocks per figure, apply and copy alternating")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option(
      "--apply-threads", o.apply_helpers,
      "extra threads applying one large partition (as psched-server; default cores - 1)");
  app.add_option("--json", o.json, "also write every figure to this file");
  app.add_flag("--cpu-only", o.cpu_only, "no gpu rows, even with a GPU");
  app.add_option("--gpu-sizes", o.gpu_sizes, "gpu rows: variable sizes, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--gpu-optimizers", o.gpu_optimizers, "gpu rows: optimizer kinds")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--device", o.device, "gpu rows: CUDA device number");
  CLI11_PARSE(app, argc, argv);
  try {
    return psched::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "psched-apply-bench: %s\n", e.what());
    return 1;
  }
}
