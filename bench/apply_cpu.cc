#include "bench/apply_cpu.h"

#include <sys/resource.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/variable.h"
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

// A Variable pushed whole, one step after the other, as one async worker would.
struct PushedVariable {
  Variable variable;
  Step step = 0;

  void push(std::span<const std::byte> grad) {
    variable.push(WorkerId(0), ++step, variable.part(), DType::float32, grad);
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
                    .priority = 0,
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
  PushedVariable one{Variable(spec, {0, n}, initial_bytes, Mode::async, 1)};
  PushedVariable pooled{Variable(spec, {0, n}, initial_bytes, Mode::async, 1, &pool)};
  CopyBuffers buffers(row.traffic_bytes / 2);

  const uint64_t all = buffers.from.size();
  Totals apply_one, memcpy_one, stream_one, apply_pool, memcpy_pool, stream_pool;
  const double block = options.seconds / options.rounds;
  for (int round = 0; round < options.rounds; ++round) {
    time_block(block, apply_one, [&] { one.push(grad_bytes); });
    time_block(block, memcpy_one, [&] { buffers.copy(false, 0, all); });
    time_block(block, stream_one, [&] { buffers.copy(true, 0, all); });
    time_block(block, apply_pool, [&] { pooled.push(grad_bytes); });
    time_block(block, memcpy_pool, [&] { buffers.copy_on(pool, row.pool_threads, false); });
    time_block(block, stream_pool, [&] { buffers.copy_on(pool, row.pool_threads, true); });
  }
  const uint64_t bytes_per = row.traffic_bytes;
  row.one = {apply_one.rate(bytes_per), memcpy_one.rate(bytes_per), stream_one.rate(bytes_per)};
  row.pool = {apply_pool.rate(bytes_per), memcpy_pool.rate(bytes_per), stream_pool.rate(bytes_per)};
  return row;
}

double ApplyAndCopies::ratio() const {
  return apply.gb_per_s / std::max(memcpy.gb_per_s, streaming.gb_per_s);
}

void print_cpu_header(unsigned pool_width) {
  fmt::print(
      "apply on the CPU: Variable::push of the whole variable against copies of as many bytes\n"
      "as it reads and writes (memcpy; nt: non-temporal stores); ratio = apply / faster copy;\n"
      "GB/s of traffic (bytes read + written), GB = 1e9; pool: {} threads; cores = CPU s / "
      "wall s\n",
      pool_width);
  fmt::print("{:>8} {:>7} {:>8} | {:>6} {:>6} {:>6} {:>5} | {:>3} {:>6} {:>6} {:>6} {:>5} {:>5}\n",
             "optim", "size", "traffic", "apply", "memcpy", "nt", "ratio", "thr", "apply", "memcpy",
             "nt", "ratio", "cores");
}

void print_cpu_row(const CpuApplyRow& r) {
  fmt::print(
      "{:>8} {:>7} {:>8} | {:>6.2f} {:>6.2f} {:>6.2f} {:>5.2f} | {:>3} {:>6.2f} {:>6.2f} {:>6.2f} "
      "{:>5.2f} {:>5.2f}\n",
      r.optimizer, format_byte_size(r.bytes), format_byte_size(r.traffic_bytes),
      r.one.apply.gb_per_s, r.one.memcpy.gb_per_s, r.one.streaming.gb_per_s, r.one.ratio(),
      r.pool_threads, r.pool.apply.gb_per_s, r.pool.memcpy.gb_per_s, r.pool.streaming.gb_per_s,
      r.pool.ratio(), r.pool.apply.cpu_per_wall);
  std::fflush(stdout);
}

nlohmann::json to_json(const ApplyAndCopies& a) {
  return {{"apply", to_json(a.apply)},
          {"memcpy", to_json(a.memcpy)},
          {"streaming_copy", to_json(a.streaming)},
          {"ratio", a.ratio()}};
}

nlohmann::json to_json(const CpuApplyRow& r) {
  nlohmann::json pool = to_json(r.pool);
  pool["threads"] = r.pool_threads;
  return {{"optimizer", r.optimizer},          {"size_bytes", r.bytes},
          {"size", format_byte_size(r.bytes)}, {"traffic_bytes", r.traffic_bytes},
          {"one_thread", to_json(r.one)},      {"pool", pool}};
}

}  // namespace psched::bench
