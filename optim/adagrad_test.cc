// SPDX-License-Identifier: Apache-2.0
// adagrad kernel against the scalar torch.optim.Adagrad formula.
#include <doctest/doctest.h>

#include "optim/reference_check.h"

namespace psched::optim::testing {

TEST_CASE_TEMPLATE("adagrad matches the scalar torch formula on odd sizes", T, float, double) {
  check_on_odd_sizes<T>(specs::adagrad());
}

TEST_CASE_TEMPLATE(
    "adagrad with lr decay, an initial accumulator and weight decay matches the torch formula", T,
    float, double) {
  check_on_odd_sizes<T>(specs::adagrad_decay());
}

TEST_CASE("adagrad's accumulator starts at initial_accumulator_value") {
  const OptimizerSpec spec = specs::adagrad_decay();
  CHECK(initial_state_value(spec, 0) == spec.initial_accumulator_value);
  CHECK(initial_state_value(specs::adam(), 1) == 0);
}

}  // namespace psched::optim::testing
