// SPDX-License-Identifier: Apache-2.0
// rmsprop kernel against the scalar torch.optim.RMSprop formula.
#include <doctest/doctest.h>

#include "optim/reference_check.h"

namespace psched::optim::testing {

TEST_CASE_TEMPLATE("plain rmsprop matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::rmsprop());
}

TEST_CASE_TEMPLATE("rmsprop with weight decay matches the scalar torch formula on odd sizes", T,
                   float, double) {
  check_on_odd_sizes<T>(specs::rmsprop_weight_decay());
}

TEST_CASE_TEMPLATE("centered rmsprop matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::rmsprop_centered());
}

TEST_CASE_TEMPLATE("rmsprop with momentum matches the scalar torch formula on odd sizes", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::rmsprop_momentum());
}

TEST_CASE_TEMPLATE("centered rmsprop with momentum matches the scalar torch formula", T, float,
                   double) {
  check_on_odd_sizes<T>(specs::rmsprop_centered_momentum());
}

TEST_CASE("rmsprop keeps square_avg, then the momentum buffer, then grad_avg") {
  const OptimizerSpec spec = specs::rmsprop_centered_momentum();
  REQUIRE(state_slots(spec) == 3);
  std::vector<double> param{0}, grad{2}, square_avg{0}, buf{0}, grad_avg{0};
  std::vector<std::span<double>> state{std::span<double>(square_avg), std::span<double>(buf),
                                       std::span<double>(grad_avg)};
  apply(spec, std::span<double>(param), grad, state, 1);
  CHECK(square_avg[0] == doctest::Approx(0.01 * 4));
  CHECK(grad_avg[0] == doctest::Approx(0.01 * 2));
  CHECK(buf[0] == doctest::Approx(2 / (std::sqrt(0.04 - 0.0004) + 1e-8)));
  CHECK(state_slots(specs::rmsprop_centered()) == 2);
  CHECK(state_slots(specs::rmsprop()) == 1);
}

}  // namespace psched::optim::testing
