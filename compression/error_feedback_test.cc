// SPDX-License-Identifier: Apache-2.0
#include "compression/error_feedback.h"

#include <cmath>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "compression/codec.h"

namespace psched {
namespace {

template <typename T>
struct Feedback {
  WireFormat format;
  TopK topk;
  std::vector<T> residual;
  std::vector<std::byte> body{}, scratch{};

  // Sends `gradient`; returns what a shard decodes.
  std::vector<T> send(const std::vector<T>& gradient) {
    DType dtype = sizeof(T) == 4 ? DType::float32 : DType::float64;
    encode_with_feedback(format, dtype, std::as_bytes(std::span(gradient)),
                         std::as_writable_bytes(std::span(residual)), topk, body, scratch);
    std::vector<T> sent(gradient.size());
    decode(format, dtype, body, std::as_writable_bytes(std::span(sent)));
    return sent;
  }
};

TEST_CASE("topk with feedback sends each element whole or keeps it whole, so nothing is lost") {
  // float32, 1000 steps: element by element, sent + residual equals the gradient plus the
  // residual before, exactly; so the sum of what was sent plus the residual is the sum of the
  // gradients as the residual accumulated it.
  std::mt19937 random(3);
  std::normal_distribution<float> normal;
  const size_t n = 500;
  Feedback<float> f{WireFormat::topk, {.fraction = 0.01}, std::vector<float>(n)};
  std::vector<float> owed(n);  // gradient + residual, summed as the worker does
  size_t nonzero_residuals = 0;
  for (int step = 0; step < 1000; ++step) {
    std::vector<float> gradient(n);
    for (float& g : gradient) g = normal(random);
    std::vector<float> before = f.residual;
    std::vector<float> sent = f.send(gradient);
    size_t sent_count = 0;
    for (size_t i = 0; i < n; ++i) {
      float total = gradient[i] + before[i];
      CHECK(sent[i] + f.residual[i] == total);
      CHECK((sent[i] == 0 || f.residual[i] == 0));
      sent_count += sent[i] != 0;
    }
    CHECK(sent_count <= 5);
    nonzero_residuals = 0;
    for (float r : f.residual) nonzero_residuals += r != 0;
  }
  CHECK(nonzero_residuals > n / 2);  // most of each step waits
}

TEST_CASE("onebit with feedback conserves the sum of the gradients exactly over many steps") {
  // float64 on values that are sums of small powers of two, so every rounding is exact: the
  // sum of what was sent plus the final residual equals the sum of the gradients, bit for bit.
  std::mt19937 random(5);
  std::uniform_int_distribution<int> small(-16, 16);
  const size_t n = 8;
  Feedback<double> f{WireFormat::onebit, {}, std::vector<double>(n)};
  std::vector<double> sent_total(n), gradient_total(n);
  for (int step = 0; step < 12; ++step) {
    std::vector<double> gradient(n);
    for (double& g : gradient) g = small(random) / 16.0;
    std::vector<double> sent = f.send(gradient);
    for (size_t i = 0; i < n; ++i) {
      sent_total[i] += sent[i];
      gradient_total[i] += gradient[i];
    }
  }
  for (size_t i = 0; i < n; ++i) CHECK(sent_total[i] + f.residual[i] == gradient_total[i]);
}

TEST_CASE("onebit with feedback keeps the residual bounded") {
  std::mt19937 random(11);
  std::normal_distribution<float> normal;
  const size_t n = 1000;
  Feedback<float> f{WireFormat::onebit, {}, std::vector<float>(n)};
  float largest = 0;
  for (int step = 0; step < 500; ++step) {
    std::vector<float> gradient(n);
    for (float& g : gradient) g = normal(random);
    f.send(gradient);
    for (float r : f.residual) largest = std::max(largest, std::abs(r));
  }
  CHECK(largest < 20.0f);  // a diverging memory grows with the steps (~ sqrt(500) x 22)
}

}  // namespace
}  // namespace psched
