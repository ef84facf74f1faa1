// SPDX-License-Identifier: Apache-2.0
// psched-codec-bench: what encoding a partition costs on one core, in ms per MiB of float32
// gradient, top-k against a bf16 encode of the same partition (measured in the same run):
//   bf16         encode(bf16): read each float, write its top half
//   topk         encode(topk): a threshold sampled from 1,024 elements, one pass keeping what
//                reaches it, the exact k among those (compression/codec.cc)
//   topk-copy    the selection it replaced: nth_element over a copy of every magnitude, then a
//                pass; kept here as the baseline of the change
//   topk+ef      encode_with_feedback(topk): the worker's push, the residual added first and
//                kept after
//   psched-codec-bench [--sizes 256KiB,4MiB] [--fraction 0.01] [--seconds 0.5]
// Gradients are normal draws (seed 1). Each figure is the fastest of 5 rounds of --seconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "config/byte_size.h"

namespace {

using Clock = std::chrono::steady_clock;

// The fastest of `rounds` rounds of at least `seconds`, in seconds a call.
double fastest(const std::function<void()>& call, double seconds, int rounds = 5) {
  double best = INFINITY;
  for (int round = 0; round < rounds; ++round) {
    uint64_t calls = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      call();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds);
    best = std::min(best, elapsed / static_cast<double>(calls));
  }
  return best;
}

// The k largest magnitudes as the codec chose them before the sampled threshold: nth_element
// over a copy of every magnitude, then a pass for the elements above it (ties aside).
void topk_by_copy(std::span<const float> values, uint64_t k, std::vector<float>& magnitudes,
                  std::vector<uint32_t>& kept) {
  magnitudes.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) magnitudes[i] = std::abs(values[i]);
  const auto at = magnitudes.begin() + static_cast<ptrdiff_t>(values.size() - k);
  std::nth_element(magnitudes.begin(), at, magnitudes.end());
  kept.clear();
  for (size_t i = 0; i < values.size() && kept.size() < k; ++i)
    if (std::abs(values[i]) >= *at) kept.push_back(static_cast<uint32_t>(i));
}

void measure(uint64_t bytes, double fraction, double seconds) {
  const uint64_t n = bytes / sizeof(float);
  std::vector<float> gradient(n);
  std::mt19937 random(1);
  std::normal_distribution<float> normal;
  for (float& g : gradient) g = normal(random);
  const auto values = std::as_bytes(std::span<const float>(gradient));
  const psched::TopK topk{.fraction = fraction};
  std::vector<std::byte> body, scratch;
  std::vector<float> residual(n, 0.0f), magnitudes;
  std::vector<uint32_t> kept;
  const double mib = static_cast<double>(bytes) / (1 << 20);
  auto per_mib = [&](double s) { return s * 1e3 / mib; };
  const double bf16 = fastest(
      [&] { psched::encode(psched::WireFormat::bf16, psched::DType::float32, values, topk, body); },
      seconds);
  const double sampled = fastest(
      [&] { psched::encode(psched::WireFormat::topk, psched::DType::float32, values, topk, body); },
      seconds);
  const double copy =
      fastest([&] { topk_by_copy(gradient, topk.of(n), magnitudes, kept); }, seconds);
  const double feedback = fastest(
      [&] {
        psched::encode_with_feedback(psched::WireFormat::topk, psched::DType::float32, values,
                                     std::as_writable_bytes(std::span(residual)), topk, body,
                                     scratch);
      },
      seconds);
  std::printf(
      "%8.0f KiB  bf16 %7.3f  topk %7.3f (%.2fx bf16)  topk-copy %7.3f (%.2fx)  "
      "topk+ef %7.3f (%.2fx)  ms/MiB\n",
      static_cast<double>(bytes) / 1024, per_mib(bf16), per_mib(sampled), sampled / bf16,
      per_mib(copy), copy / bf16, per_mib(feedback), feedback / bf16);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-codec-bench: top-k and bf16 encodes, ms per MiB of float32"};
  std::vector<std::string> sizes{"256KiB", "4MiB"};
  double fraction = 0.01, seconds = 0.5;
  app.add_option("--sizes", sizes, "partition sizes, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--fraction", fraction, "top-k's fraction")->check(CLI::Range(1e-6, 1.0));
  app.add_option("--seconds", seconds, "seconds a round")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::printf("top-k of %g, one core; fastest of 5 rounds of %g s\n", fraction, seconds);
  for (const std::string& size : sizes) {
    const std::optional<uint64_t> bytes = psched::parse_byte_size(size);
    if (!bytes || *bytes < 4096 || *bytes % 4 != 0) {
      std::fprintf(stderr, "psched-codec-bench: '%s' is no size of 1024 or more floats\n",
                   size.c_str());
      return 2;
    }
    measure(*bytes, fraction, seconds);
  }
  return 0;
}
