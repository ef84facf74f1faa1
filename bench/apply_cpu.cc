// SPDX-License-Identifier: Apache-2.0
#include "bench/apply_cpu.h"

#include <sys/resource.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/shard/variable.h"
#include "bench/measurement.h"
#include "common/aligned_buffer.h"
#include "config/byte_size.h"

namespace psched::bench {
namespace {

// CPU seconds (user + system) of the whole process: the pool's helpers count too.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Timed iterations summed over the blocks of one figure.
struct Totals {
  uint64_t iterations = 0;
  double wall = 0, cpu = 0;

  Rate rate(uint64_t bytes_per_iteration) const {
    return {double(bytes_per_iteration) * iterations / wall / 1e9, cpu / wall, iterations};
  }
};

// One block: an untimed iteration (it brings the block's data back into the caches the other
// figure's block evicted), then at least two timed ones for `seconds`.
template <typename Iteration>
void time_block(double seconds, Totals& into, Iteration&& iteration) {
  iteration();
  const double cpu_before = process_cpu_seconds();
  const Measurement m = time_iterations(Budget{seconds, 2, 0}, 0, iteration);
  into.cpu += process_cpu_seconds() - cpu_before;
  into.wall += m.seconds;
  into.iterations += m.iterations;
}

// A Variable updated whole, one step after the other, as its shard's step machine has it
// apply one async worker's pushes.
struct PushedVariable {
  Variable variable;
  Step step;

  void push(std::span<const std::byte> grad) {
    step = step.next();
    const StepUpdate update{.step = step, .t = step.value, .pieces = {{variable.part(), 0, true}}};
    variable.take(update, {.worker = WorkerId(0),
                           .variable = VariableId(0),
                           .step = step,
                           .range = variable.part(),
                           .dtype = variable.dtype(),
                           .data = grad});
  }
};

// Copies `bytes` bytes from `from` to `to` (both 16-byte aligned) with non-temporal stores
// where the target has them (SSE2): the destination is written without being read first, so
// the bytes that cross the memory bus are exactly those counted (read + written), as in an
// in-place apply. memcpy may read the destination first (regular stores, `rep movsb`); the
// baseline is whichever copy is faster.
void streaming_copy(std::byte* to, const std::byte* from, uint64_t bytes) {
#ifdef __SSE2__
  const uint64_t vectors = bytes / 16;
  auto* out = reinterpret_cast<__m128i*>(to);
  const auto* in = reinterpret_cast<const __m128i*>(from);
  for (uint64_t i = 0; i < vectors; ++i) _mm_stream_si128(out + i, _mm_load_si128(in + i));
  _mm_sfence();
  std::memcpy(to + vectors * 16, from + vectors * 16, bytes - vectors * 16);
#else
  std::memcpy(to, from, bytes);
#endif
}

// Two buffers of `bytes` bytes each, touched once so that no copy pays for page faults.
struct CopyBuffers {
  AlignedBuffer from, to;

  explicit CopyBuffers(uint64_t bytes) : from(bytes), to(bytes) {
    std::memset(from.data(), 1, bytes);
    std::memset(to.data(), 0, bytes);
  }
  // Copies bytes [begin, end) of `from` to `to`; `begin` is a multiple of 64.
  void copy(bool streaming, uint64_t begin, uint64_t end) {
    if (streaming) return streaming_copy(to.data() + begin, from.data() + begin, end - begin);
    std::memcpy(to.data() + begin, from.data() + begin, end - begin);
  }
  // Copies all of it in `pieces` near-equal pieces on `pool`, as Variable::apply splits.
  void copy_on(ForkJoinPool& pool, unsigned pieces, bool streaming) {
    const uint64_t n = from.size(), piece = ((n + pieces - 1) / pieces + 63) / 64 * 64;
    pool.run(pieces, [&](size_t i) {
      const uint64_t begin = std::min(n, i * piece);
      copy(streaming, begin, std::min(n, begin + piece));
    });
  }
};

// arrays[k][i] += grad[i] for every array but grad, i in [begin, end), in one pass: the
// apply's loads and stores without its arithmetic. kArrays: param + state slots.
template <int kArrays>
void add_grad(std::array<float*, kArrays> arrays, const float* grad, uint64_t begin, uint64_t end) {
  uint64_t i = begin;
#ifdef __SSE2__
  for (; i + 4 <= end; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    for (float* a : arrays) _mm_storeu_ps(a + i, _mm_add_ps(_mm_loadu_ps(a + i), g));
  }
#endif
  for (; i < end; ++i)
    for (float* a : arrays) a[i] += grad[i];
}

// The apply's memory traffic without its arithmetic: arrays like the variable's (param, grad,
// each state slot), each element of param and state incremented by grad's, so every array is
// read once and param and state are written once, in place, as by the apply.
struct PatternBuffers {
  std::vector<AlignedBuffer> arrays;  // 0 grad, then param and the state slots

  PatternBuffers(uint64_t elements, int slots) {
    for (int k = 0; k < 2 + slots; ++k) {
      arrays.emplace_back(elements * sizeof(float));
      std::ranges::fill(arrays.back().as<float>(), 0.5f);
    }
  }
  float* at(size_t array) { return arrays[array].as<float>().data(); }
  void run(uint64_t begin, uint64_t end) {
    const float* g = at(0);
    switch (arrays.size()) {
      case 2:
        return add_grad<1>({at(1)}, g, begin, end);
      case 3:
        return add_grad<2>({at(1), at(2)}, g, begin, end);
      case 4:
        return add_grad<3>({at(1), at(2), at(3)}, g, begin, end);
      default:
        return add_grad<4>({at(1), at(2), at(3), at(4)}, g, begin, end);
    }
  }
  // All elements in `pieces` near-equal pieces on `pool`, as Variable::apply splits.
  void run_on(ForkJoinPool& pool, unsigned pieces) {
    const uint64_t n = arrays[0].size() / sizeof(float), piece = (n + pieces - 1) / pieces;
    pool.run(pieces, [&](size_t i) {
      const uint64_t begin = std::min(n, i * piece);
      run(begin, std::min(n, begin + piece));
    });
  }
};

nlohmann::json to_json(const Rate& rate) {
  return {{"traffic_gb_per_s", rate.gb_per_s},
          {"cpu_per_wall", rate.cpu_per_wall},
          {"iterations", rate.iterations}};
}

}  // namespace

VariableSpec bench_variable_spec(const std::string& optimizer, uint64_t elements) {
  VariableSpec spec{.name = "bench/w",
                    .shape = {elements},
                    .dtype = DType::float32,
                    .priority = Priority(0),
                    .optimizer = {}};
  if (!optim::parse_optimizer_kind(optimizer, spec.optimizer.kind))
    throw std::runtime_error(fmt::format("unknown optimizer '{}'", optimizer));
  spec.optimizer.lr = 1e-3;
  // Options that change what an apply reads and writes are set as a job would set them:
  // momentum 0 would be plain sgd, its buffer never touched; torch's AdamW decays by 0.01.
  if (spec.optimizer.kind == optim::OptimizerKind::momentum) spec.optimizer.momentum = 0.9;
  if (spec.optimizer.kind == optim::OptimizerKind::adamw) spec.optimizer.weight_decay = 0.01;
  return spec;
}

uint64_t apply_traffic_bytes(const VariableSpec& spec) {
  const uint64_t slots = static_cast<uint64_t>(optim::state_slots(spec.optimizer));
  return spec.bytes() * ((2 + slots) + (1 + slots));
}

CpuApplyRow measure_cpu_apply(const CpuApplyOptions& options, const std::string& optimizer,
                              uint64_t bytes, ForkJoinPool& pool) {
  const VariableSpec spec = bench_variable_spec(optimizer, bytes / sizeof(float));
  const uint64_t n = spec.elements();
  CpuApplyRow row;
  row.optimizer = optimizer;
  row.bytes = bytes;
  row.traffic_bytes = apply_traffic_bytes(spec);
  // Variable::apply splits a partition over the pool only above this size; the copy follows.
  row.pool_threads = n > Variable::kParallelApplyElements ? pool.width() : 1;

  const std::vector<float> initial(n, 0.5f), grad(n, 1e-3f);
  const auto initial_bytes = std::as_bytes(std::span(initial));
  const auto grad_bytes = std::as_bytes(std::span(grad));
  PushedVariable one{Variable(spec, {0, n}, initial_bytes)};
  PushedVariable pooled{Variable(spec, {0, n}, initial_bytes, &pool)};
  CopyBuffers copies(row.traffic_bytes / 2);
  PatternBuffers pattern(n, optim::state_slots(spec.optimizer));

  const unsigned pieces = row.pool_threads;
  const uint64_t all = copies.from.size();
  // In ApplyAndCopies' order: apply, memcpy, streaming, pattern; one thread, then the pool.
  const std::array<std::function<void()>, 8> figures{[&] { one.push(grad_bytes); },
                                                     [&] { copies.copy(false, 0, all); },
                                                     [&] { copies.copy(true, 0, all); },
                                                     [&] { pattern.run(0, n); },
                                                     [&] { pooled.push(grad_bytes); },
                                                     [&] { copies.copy_on(pool, pieces, false); },
                                                     [&] { copies.copy_on(pool, pieces, true); },
                                                     [&] { pattern.run_on(pool, pieces); }};
  std::array<Totals, 8> totals;
  for (int round = 0; round < options.rounds; ++round)
    for (size_t f = 0; f < figures.size(); ++f)
      time_block(options.seconds / options.rounds, totals[f], figures[f]);
  auto rates = [&](size_t first) {
    const uint64_t b = row.traffic_bytes;
    return ApplyAndCopies{totals[first].rate(b), totals[first + 1].rate(b),
                          totals[first + 2].rate(b), totals[first + 3].rate(b)};
  };
  row.one = rates(0);
  row.pool = rates(4);
  return row;
}

double ApplyAndCopies::copy_gb_per_s() const {
  return std::max(memcpy.gb_per_s, streaming.gb_per_s);
}

void print_cpu_header(unsigned pool_width) {
  fmt::print(
      "apply on the CPU: Variable::take of the whole variable; copy: the faster of memcpy and\n"
      "a non-temporal copy of as many bytes as the apply reads and writes; pattern: the apply's\n"
      "reads and writes with one addition each. GB/s of traffic (bytes read + written), GB =\n"
      "1e9; a/c = apply / copy, a/p = apply / pattern; pool: {} threads; cores = CPU s / wall s\n",
      pool_width);
  fmt::print(
      "{:>8} {:>7} {:>8} | {:>6} {:>6} {:>6} {:>5} {:>5} | {:>3} {:>6} {:>6} {:>6} {:>5} "
      "{:>5} {:>5}\n",
      "optim", "size", "traffic", "apply", "copy", "pattrn", "a/c", "a/p", "thr", "apply", "copy",
      "pattrn", "a/c", "a/p", "cores");
}

void print_cpu_row(const CpuApplyRow& r) {
  auto figures = [](const ApplyAndCopies& f) {
    return fmt::format("{:>6.2f} {:>6.2f} {:>6.2f} {:>5.2f} {:>5.2f}", f.apply.gb_per_s,
                       f.copy_gb_per_s(), f.pattern.gb_per_s, f.apply.gb_per_s / f.copy_gb_per_s(),
                       f.apply.gb_per_s / f.pattern.gb_per_s);
  };
  fmt::print("{:>8} {:>7} {:>8} | {} | {:>3} {} {:>5.2f}\n", r.optimizer, format_byte_size(r.bytes),
             format_byte_size(r.traffic_bytes), figures(r.one), r.pool_threads, figures(r.pool),
             r.pool.apply.cpu_per_wall);
  std::fflush(stdout);
}

nlohmann::json to_json(const ApplyAndCopies& a) {
  return {{"apply", to_json(a.apply)},
          {"memcpy", to_json(a.memcpy)},
          {"streaming_copy", to_json(a.streaming)},
          {"pattern", to_json(a.pattern)},
          {"apply_over_copy", a.apply.gb_per_s / a.copy_gb_per_s()},
          {"apply_over_pattern", a.apply.gb_per_s / a.pattern.gb_per_s}};
}

nlohmann::json to_json(const CpuApplyRow& r) {
  nlohmann::json pool = to_json(r.pool);
  pool["threads"] = r.pool_threads;
  return {{"optimizer", r.optimizer},          {"size_bytes", r.bytes},
          {"size", format_byte_size(r.bytes)}, {"traffic_bytes", r.traffic_bytes},
          {"one_thread", to_json(r.one)},      {"pool", pool}};
}

}  // namespace psched::bench
