// SPDX-License-Identifier: Apache-2.0
// What the tests of a whole VariableShard share (shard_actors_test, durability_test): replies
// that keep what the shard answered, for the test to check after draining its loop.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"
#include "actors/shard/shard_loop_support.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"

namespace psched::testing {

// What a poll or a pull answered, once it has: the value as floats and its step, or the refusal.
struct Answered {
  std::optional<std::vector<float>> value;
  Step step;
  std::optional<Error> refusal;
  int answers = 0;

  bool done() const { return answers > 0; }
  // The reply to hand the shard; `this` outlives the answer.
  VariableShard::ValueReply reply() {
    return [this](const Result<FreshValue>& answer) {
      ++answers;
      if (!answer) {
        refusal = answer.error();
        return;
      }
      value.emplace(answer->bytes() / sizeof(float));
      answer->read_into(std::as_writable_bytes(std::span(*value)));
      step = answer->step();
    };
  }
};

// What a push's receipt said, once it has.
struct Receipted {
  std::optional<Error> refusal;
  int answers = 0;

  bool done() const { return answers > 0; }
  bool taken() const { return answers == 1 && !refusal; }
  VariableShard::Receipt reply() {
    return [this](const Result<>& receipt) {
      ++answers;
      if (!receipt) refusal = receipt.error();
    };
  }
};

// `g` as a push's bytes: valid while `g` is.
inline std::span<const std::byte> bytes_of(const std::vector<float>& g) {
  return std::as_bytes(std::span(g));
}

}  // namespace psched::testing
