// SPDX-License-Identifier: Apache-2.0
// The example trainer's model: logistic regression on a data set it generates, so the optimum
// is known. Labels are drawn from a logistic model with weights `true_weights`; the loss of
// those weights on the data is the floor training should approach.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace psched::example {

struct Dataset {
  uint32_t features = 0;
  std::vector<float> x;             // samples x features, row-major
  std::vector<float> y;             // 0 or 1
  std::vector<float> true_weights;  // features, then the bias
  size_t samples() const { return y.size(); }
};

// `samples` rows drawn with `seed`; the true weights come from `model_seed` (the same for every
// worker, so all workers learn one model from different data).
Dataset make_dataset(uint32_t features, size_t samples, uint64_t model_seed, uint64_t seed);

struct LossAndGradient {
  double loss = 0;      // mean binary cross-entropy
  double accuracy = 0;  // fraction classified right at threshold 0.5
  std::vector<float> grad_w;
  float grad_b = 0;
};

// Over rows [begin, end) of `data`.
LossAndGradient evaluate(const Dataset& data, const std::vector<float>& w, float b, size_t begin,
                         size_t end);

}  // namespace psched::example
