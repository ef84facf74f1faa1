// SPDX-License-Identifier: Apache-2.0
// What the variable tests share (shard_actors_test, gpu_test): a plain SGD spec, a variable with
// a step track of its own, a variable's value as floats, and the code of the psched::Error a
// call throws.
#pragma once

#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include "actors/shard/step_track.h"
#include "actors/shard/variable.h"
#include "common/error.h"
#include "common/error_test_support.h"

namespace psched::testing {

// Variable "w" of `n` elements under plain SGD.
inline VariableSpec sgd_spec(uint64_t n, double lr = 1.0) {
  VariableSpec spec;
  spec.name = "w";
  spec.shape = {n};
  spec.optimizer.kind = optim::OptimizerKind::sgd;
  spec.optimizer.lr = lr;
  return spec;
}

inline std::vector<float> value_of(const Variable& v) {
  std::vector<float> out(v.part().size());
  v.read(v.part(), reinterpret_cast<std::byte*>(out.data()));
  return out;
}

// A variable and a step track of its own, which take a push as a shard's StepMachine and
// the variable do (VariableShard), without a shard: the tests of the kind on its own.
struct Tracked {
  Variable variable;
  StepTrack track;

  Tracked(const VariableSpec& spec, ElementRange part, std::span<const std::byte> initial,
          Mode mode, uint32_t workers, ForkJoinPool* pool = nullptr,
          optim::ComputeDevice* device = nullptr, const Membership* members = nullptr)
      : variable(spec, part, initial, pool, device),
        track(spec.name, part, mode, workers, members) {}
  Tracked(Variable v, StepTrack t) : variable(std::move(v)), track(std::move(t)) {}

  struct Outcome {
    bool duplicate = false;
    std::vector<ElementRange> applied;  // the ranges whose update this push applied
  };
  // Checks the push as the shard does (throws what it would refuse with), then takes it.
  Outcome push(WorkerId worker, Step step, ElementRange range, DType dtype,
               std::span<const std::byte> data, PushedGradient gradient = PushedGradient::whole) {
    const Push push{worker, VariableId(0), step, range, dtype, data, gradient};
    variable.check_push(push);
    if (track.is_duplicate(worker, step, range)) return {.duplicate = true};
    const StepUpdate update = track.receive(worker, step, range);
    variable.take(update, push);
    return {.applied = complete_ranges(update)};
  }
  // The track's settle(), carried out.
  std::vector<StepUpdate> settle() {
    std::vector<StepUpdate> updates = track.settle();
    for (const StepUpdate& update : updates) variable.apply_gathered(update);
    return updates;
  }
  std::vector<ElementRange> complete_without_missing() {
    const StepUpdate update = track.complete_without_missing();
    variable.apply_gathered(update);
    return complete_ranges(update);
  }
  static std::vector<ElementRange> complete_ranges(const StepUpdate& update) {
    std::vector<ElementRange> out;
    for (const StepPiece& piece : update.pieces)
      if (piece.complete) out.push_back(piece.range);
    return out;
  }

  // A variable record as a shard's checkpoint holds it, and back.
  void save(ByteWriter& out) const {
    variable.save_head(out);
    track.save(out);
    variable.save_sums(out);
  }
  static Tracked restore(ByteReader& in, Mode mode, uint32_t workers, ForkJoinPool* pool = nullptr,
                         optim::ComputeDevice* device = nullptr) {
    Variable v = Variable::restore(in, pool, device);
    StepTrack t(v.spec().name, v.part(), mode, workers, nullptr);
    t.load(in);
    v.load_sums(in);
    return Tracked(std::move(v), std::move(t));
  }
};

inline std::vector<float> value_of(const Tracked& v) {
  return value_of(v.variable);
}

}  // namespace psched::testing
