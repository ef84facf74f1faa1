// SPDX-License-Identifier: Apache-2.0
// adam, adamw and adam_tf kernels against the scalar torch.optim / TF ApplyAdam formulas.
#include <doctest/doctest.h>

#include <cmath>

#include "optim/reference_check.h"

namespace psched::optim::testing {

TEST_CASE_TEMPLATE("adam matches the scalar torch formula on odd sizes", T, float, double) {
  check_on_odd_sizes<T>(specs::adam());
}

TEST_CASE_TEMPLATE("adam with amsgrad matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::adam_amsgrad());
}

TEST_CASE_TEMPLATE("adam with weight decay matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::adam_weight_decay());
}

TEST_CASE_TEMPLATE("adam with amsgrad and weight decay matches the scalar torch formula", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::adam_amsgrad_weight_decay());
}

TEST_CASE_TEMPLATE("adamw matches the scalar torch formula on odd sizes", T, float, double) {
  check_on_odd_sizes<T>(specs::adamw());
}

TEST_CASE_TEMPLATE("adamw with amsgrad matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::adamw_amsgrad());
}

TEST_CASE_TEMPLATE("adam_tf matches the scalar TensorFlow ApplyAdam formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::adam_tf());
}

TEST_CASE("amsgrad keeps the largest second moment seen") {
  const OptimizerSpec spec = specs::adam_amsgrad();
  std::vector<double> param{0}, m{0}, v{0}, v_max{0};
  std::vector<std::span<double>> state{std::span<double>(m), std::span<double>(v),
                                       std::span<double>(v_max)};
  const std::vector<double> grads{3.0, 0.0};
  apply(spec, std::span<double>(param), std::span<const double>(&grads[0], 1), state, 1);
  const double first_v = v[0];
  apply(spec, std::span<double>(param), std::span<const double>(&grads[1], 1), state, 2);
  CHECK(v[0] < first_v);
  CHECK(v_max[0] == first_v);
}

TEST_CASE("a frozen adam variance is read, not updated, and bias-corrected as of the freeze") {
  const OptimizerSpec spec = specs::adam();
  std::vector<double> param{0}, m{0}, v{0};
  std::vector<std::span<double>> state{std::span<double>(m), std::span<double>(v)};
  const std::vector<double> grads{1.0, 30.0, 30.0};
  apply(spec, std::span<double>(param), std::span<const double>(&grads[0], 1), state, 1);
  const double warm_v = v[0];  // (1 - beta2) * 1
  for (uint64_t t = 2; t <= 3; ++t) {
    const double before = param[0], m_expected = spec.beta1 * m[0] + (1 - spec.beta1) * 30.0;
    apply(spec, std::span<double>(param), std::span<const double>(&grads[t - 1], 1), state, t,
          /*variance_frozen_after=*/1);
    CHECK(v[0] == warm_v);
    CHECK(m[0] == doctest::Approx(m_expected));
    // v bias-corrected with t = 1: v_hat = 1, so the step is lr * m_hat (up to eps).
    const double m_hat = m_expected / (1 - std::pow(spec.beta1, double(t)));
    CHECK(before - param[0] == doctest::Approx(spec.lr * m_hat).epsilon(1e-7));
  }
}

TEST_CASE("the first adam step moves each parameter by about lr against its gradient sign") {
  // With bias correction, step 1 is lr * g / (|g| + eps): the textbook sanity check.
  const OptimizerSpec spec = specs::adam();
  std::vector<double> param{1, 1}, grad{0.5, -2}, m(2), v(2);
  std::vector<std::span<double>> state{std::span<double>(m), std::span<double>(v)};
  apply(spec, std::span<double>(param), grad, state, 1);
  CHECK(param[0] == doctest::Approx(1 - spec.lr));
  CHECK(param[1] == doctest::Approx(1 + spec.lr));
}

}  // namespace psched::optim::testing
