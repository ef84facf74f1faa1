// SPDX-License-Identifier: Apache-2.0
// Names, validation, state layout and apply()'s contract, for every optimizer.
#include "optim/optimizer.h"

#include <limits>
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>

#include "common/error.h"
#include "common/error_test_support.h"
#include "optim/reference_check.h"

namespace psched::optim::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// The message validate() throws for `spec`, or "" if it accepts it.
std::string rejection(const OptimizerSpec& spec) {
  return psched::testing::refusal(ErrorCode::invalid_argument, [&] { validate(spec); });
}

// `spec` after `change`.
template <typename Change>
OptimizerSpec with(OptimizerSpec spec, Change change) {
  change(spec);
  return spec;
}

}  // namespace

TEST_CASE("every optimizer kind round-trips through its name") {
  const OptimizerKind kinds[] = {
      OptimizerKind::sgd,   OptimizerKind::momentum, OptimizerKind::adam,   OptimizerKind::adam_tf,
      OptimizerKind::adamw, OptimizerKind::adagrad,  OptimizerKind::rmsprop};
  const std::string_view names[] = {"sgd",   "momentum", "adam",   "adam_tf",
                                    "adamw", "adagrad",  "rmsprop"};
  for (size_t i = 0; i < std::size(kinds); ++i) {
    CHECK(to_string(kinds[i]) == names[i]);
    OptimizerKind parsed = OptimizerKind::sgd;
    REQUIRE(parse_optimizer_kind(names[i], parsed));
    CHECK(parsed == kinds[i]);
  }
}

TEST_CASE("an unknown optimizer name does not parse and leaves the output alone") {
  OptimizerKind kind = OptimizerKind::rmsprop;
  CHECK_FALSE(parse_optimizer_kind("Adam", kind));
  CHECK_FALSE(parse_optimizer_kind("", kind));
  CHECK(kind == OptimizerKind::rmsprop);
}

TEST_CASE("validate accepts torch's defaults and every tested option combination") {
  for (auto kind :
       {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam, OptimizerKind::adam_tf,
        OptimizerKind::adamw, OptimizerKind::adagrad, OptimizerKind::rmsprop}) {
    CAPTURE(to_string(kind));
    CHECK(rejection(OptimizerSpec{.kind = kind}) == "");
  }
  for (const NamedSpec& combination : all_option_combinations()) {
    CAPTURE(combination.name);  // not a structured binding: clang 14 cannot capture one
    const OptimizerSpec& spec = combination.spec;
    CHECK(rejection(spec) == "");
  }
}

TEST_CASE("validate names the optimizer, the field and the value it rejects") {
  CHECK(rejection(with(specs::adam(), [](auto& s) { s.beta1 = 1.5; })) ==
        "optimizer 'adam': beta1 = 1.5 is outside [0, 1)");
  CHECK(rejection(with(specs::sgd(), [](auto& s) { s.lr = -1; })) ==
        "optimizer 'sgd': lr = -1 must be finite and >= 0");
}

TEST_CASE("validate rejects each out-of-range hyper-parameter") {
  struct Case {
    OptimizerSpec spec;
    std::string_view expected;  // a part of the message
  };
  const Case cases[] = {
      {with(specs::adam(), [](auto& s) { s.lr = kInf; }), "'adam': lr = inf"},
      {with(specs::adam(), [](auto& s) { s.lr = kNan; }), "'adam': lr = nan"},
      {with(specs::sgd(), [](auto& s) { s.weight_decay = -0.1; }), "weight_decay = -0.1"},
      {with(specs::momentum(), [](auto& s) { s.momentum = -0.5; }), "momentum = -0.5"},
      {with(specs::momentum(), [](auto& s) { s.dampening = 1.5; }),
       "dampening = 1.5 is outside [0, 1]"},
      {with(specs::nesterov(), [](auto& s) { s.momentum = 0; }), "nesterov = true requires"},
      {with(specs::nesterov(), [](auto& s) { s.dampening = 0.1; }), "dampening = 0.1)"},
      {with(specs::adamw(), [](auto& s) { s.beta2 = 1.0; }), "'adamw': beta2 = 1 is outside"},
      {with(specs::adam_tf(), [](auto& s) { s.beta1 = -0.1; }), "'adam_tf': beta1 = -0.1"},
      {with(specs::adam(), [](auto& s) { s.eps = -1e-8; }), "eps = -1e-08"},
      {with(specs::adam(), [](auto& s) { s.weight_decay = -1; }), "weight_decay = -1"},
      {with(specs::adagrad(), [](auto& s) { s.lr_decay = -1; }), "lr_decay = -1"},
      {with(specs::adagrad(), [](auto& s) { s.initial_accumulator_value = -1; }),
       "initial_accumulator_value = -1"},
      {with(specs::adagrad(), [](auto& s) { s.eps = kNan; }), "'adagrad': eps = nan"},
      {with(specs::rmsprop(), [](auto& s) { s.alpha = 1.0; }), "alpha = 1 is outside [0, 1)"},
      {with(specs::rmsprop(), [](auto& s) { s.momentum = -1; }), "'rmsprop': momentum = -1"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expected);
    const std::string message = rejection(c.spec);
    CAPTURE(message);
    CHECK(message.find(c.expected) != std::string::npos);
  }
}

TEST_CASE("validate ignores the fields an optimizer does not read") {
  CHECK(rejection(with(specs::sgd(), [](auto& s) { s.beta1 = 5; })) == "");
  CHECK(rejection(with(specs::adam_tf(), [](auto& s) { s.weight_decay = -1; })) == "");
  CHECK(rejection(with(specs::adam(), [](auto& s) { s.nesterov = true; })) == "");
}

TEST_CASE("state slots match each formula's state and start at zero but for adagrad") {
  for (const NamedSpec& combination : all_option_combinations()) {
    CAPTURE(combination.name);  // not a structured binding: clang 14 cannot capture one
    const OptimizerSpec& spec = combination.spec;
    CHECK(state_slots(spec) == reference_slot_count(spec));
    for (int k = 0; k < state_slots(spec); ++k) {
      const bool adagrad = spec.kind == OptimizerKind::adagrad;
      CHECK(initial_state_value(spec, k) == (adagrad ? spec.initial_accumulator_value : 0.0));
    }
  }
  CHECK_THROWS_AS(initial_state_value(specs::sgd(), 0), std::logic_error);
}

TEST_CASE("apply rejects buffers whose sizes do not match") {
  const OptimizerSpec spec = specs::adam();
  std::vector<float> param(4), grad(4), m(4), v(4), short_grad(3), short_v(3);
  std::vector<std::span<float>> state{std::span<float>(m), std::span<float>(v)};
  std::vector<std::span<float>> one_slot{std::span<float>(m)};
  std::vector<std::span<float>> short_slot{std::span<float>(m), std::span<float>(short_v)};
  const std::span<float> p(param);
  CHECK_THROWS_WITH_AS(apply(spec, p, short_grad, state, 1), doctest::Contains("grad.size() = 3"),
                       std::logic_error);
  CHECK_THROWS_AS(apply(spec, p, grad, one_slot, 1), std::logic_error);
  CHECK_THROWS_AS(apply(spec, p, grad, short_slot, 1), std::logic_error);
  CHECK_THROWS_WITH_AS(apply(spec, p, grad, state, 0), doctest::Contains("t >= 1"),
                       std::logic_error);
  CHECK_THROWS_WITH_AS(apply(spec, p, grad, state, 2, 2), doctest::Contains("frozen_after < t"),
                       std::logic_error);
  CHECK_NOTHROW(apply(spec, p, grad, state, 1));
}

TEST_CASE_TEMPLATE("an empty range is a no-op for every optimizer", T, float, double) {
  for (const NamedSpec& combination : all_option_combinations()) {
    CAPTURE(combination.name);  // not a structured binding: clang 14 cannot capture one
    const OptimizerSpec& spec = combination.spec;
    std::vector<std::span<T>> state(state_slots(spec));
    CHECK_NOTHROW(apply(spec, std::span<T>(), std::span<const T>(), state, 1));
  }
}

// Applies 3 steps to the whole of a random variable and to a copy split at `split`, one
// apply() per piece, and requires bit-identical results: the kernels are element-wise and do
// not depend on where an element sits (see the EIGEN_FAST_MATH note in CMakeLists.txt).
template <typename T>
void check_split_equals_whole(const OptimizerSpec& spec, size_t size, size_t split) {
  std::mt19937 rng(7);
  KernelVariable<T> whole(spec, random_values<T>(rng, size, 1.0));
  KernelVariable<T> pieces = whole;
  for (uint64_t t = 1; t <= 3; ++t) {
    const std::vector<T> grad = random_values<T>(rng, size, kGradScales[t - 1]);
    whole.step(spec, grad, t);
    for (auto [begin, end] : {std::pair{size_t{0}, split}, std::pair{split, size}}) {
      std::vector<std::span<T>> state;
      for (auto& slot : pieces.state)
        state.push_back(std::span<T>(slot).subspan(begin, end - begin));
      apply(spec, std::span<T>(pieces.param).subspan(begin, end - begin),
            std::span<const T>(grad).subspan(begin, end - begin), state, t);
    }
  }
  CHECK(whole.param == pieces.param);
  CHECK(whole.state == pieces.state);
}

TEST_CASE_TEMPLATE("a partition applied in two pieces equals the whole applied at once", T, float,
                   double) {
  for (const NamedSpec& combination : all_option_combinations()) {
    CAPTURE(combination.name);  // not a structured binding: clang 14 cannot capture one
    const OptimizerSpec& spec = combination.spec;
    for (size_t split : {size_t{1}, size_t{511}, size_t{1022}}) {
      CAPTURE(split);
      check_split_equals_whole<T>(spec, 1023, split);
    }
    check_split_equals_whole<T>(spec, 100003, 65541);  // both sides of the parallel threshold
  }
}

}  // namespace psched::optim::testing
