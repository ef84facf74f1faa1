// SPDX-License-Identifier: Apache-2.0
#include "apps/logistic_model.h"

#include <cmath>
#include <random>

namespace psched::example {

Dataset make_dataset(uint32_t features, size_t samples, uint64_t model_seed, uint64_t seed) {
  Dataset d;
  d.features = features;
  std::mt19937_64 model_rng(model_seed), rng(seed);
  std::normal_distribution<float> normal;
  for (uint32_t j = 0; j <= features; ++j) d.true_weights.push_back(normal(model_rng));
  std::uniform_real_distribution<double> uniform;
  d.x.resize(samples * features);
  for (size_t i = 0; i < samples; ++i) {
    double z = d.true_weights[features];
    for (uint32_t j = 0; j < features; ++j) {
      float v = normal(rng);
      d.x[i * features + j] = v;
      z += v * d.true_weights[j];
    }
    d.y.push_back(uniform(rng) < 1 / (1 + std::exp(-z)) ? 1.f : 0.f);
  }
  return d;
}

LossAndGradient evaluate(const Dataset& data, const std::vector<float>& w, float b, size_t begin,
                         size_t end) {
  LossAndGradient out;
  out.grad_w.assign(data.features, 0.f);
  double grad_b = 0;
  for (size_t i = begin; i < end; ++i) {
    const float* x = &data.x[i * data.features];
    double z = b;
    for (uint32_t j = 0; j < data.features; ++j) z += x[j] * w[j];
    double p = 1 / (1 + std::exp(-z)), y = data.y[i];
    out.loss -= y * std::log(std::max(p, 1e-12)) + (1 - y) * std::log(std::max(1 - p, 1e-12));
    out.accuracy += (p >= 0.5) == (y == 1);
    for (uint32_t j = 0; j < data.features; ++j)
      out.grad_w[j] += static_cast<float>((p - y) * x[j]);
    grad_b += p - y;
  }
  double n = static_cast<double>(end - begin);
  out.loss /= n;
  out.accuracy /= n;
  for (float& g : out.grad_w) g = static_cast<float>(g / n);
  out.grad_b = static_cast<float>(grad_b / n);
  return out;
}

}  // namespace psched::example
