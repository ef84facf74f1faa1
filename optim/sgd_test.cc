// SPDX-License-Identifier: Apache-2.0
// sgd and momentum kernels against the scalar torch.optim.SGD formula.
#include <doctest/doctest.h>

#include "optim/reference_check.h"

namespace psched::optim::testing {

TEST_CASE_TEMPLATE("plain sgd matches the scalar torch formula on odd sizes", T, float, double) {
  check_on_odd_sizes<T>(specs::sgd());
}

TEST_CASE_TEMPLATE("sgd with weight decay matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::sgd_weight_decay());
}

TEST_CASE_TEMPLATE("momentum without dampening matches the scalar torch formula on odd sizes", T,
                   float, double) {
  check_on_odd_sizes<T>(specs::momentum());
}

TEST_CASE_TEMPLATE("momentum with dampening matches the scalar torch formula on odd sizes", T,
                   float, double) {
  check_on_odd_sizes<T>(specs::momentum_dampening());
}

TEST_CASE_TEMPLATE("momentum with dampening and weight decay matches the scalar torch formula", T,
                   float, double) {
  check_on_odd_sizes<T>(specs::momentum_weight_decay());
}

TEST_CASE_TEMPLATE("nesterov momentum matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::nesterov());
}

TEST_CASE_TEMPLATE("nesterov momentum with weight decay matches the scalar torch formula", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::nesterov_weight_decay());
}

TEST_CASE_TEMPLATE("momentum of zero is plain sgd and leaves the buffer untouched", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::momentum_zero());
  const OptimizerSpec spec = specs::momentum_zero();
  std::vector<T> param{1, 2}, grad{T(0.5), T(-1)}, buf{7, 7};
  std::vector<std::span<T>> state{std::span<T>(buf)};
  for (uint64_t t = 1; t <= 2; ++t) apply(spec, std::span<T>(param), grad, state, t);
  CHECK(param[0] == T(1) - T(0.1) * T(0.5) - T(0.1) * T(0.5));
  CHECK(buf == std::vector<T>{7, 7});
}

TEST_CASE("the first momentum step sets the buffer to the gradient without dampening") {
  const OptimizerSpec spec = specs::momentum_dampening();
  std::vector<double> param{1}, grad{2}, buf{123};
  std::vector<std::span<double>> state{std::span<double>(buf)};
  apply(spec, std::span<double>(param), grad, state, 1);
  CHECK(buf[0] == 2);
  apply(spec, std::span<double>(param), grad, state, 2);
  CHECK(buf[0] == doctest::Approx(0.9 * 2 + 0.7 * 2));
}

}  // namespace psched::optim::testing
