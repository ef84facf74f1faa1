// SPDX-License-Identifier: Apache-2.0
// Small strong types for the numbers psched passes around, so a step is never mistaken for a
// byte count or a worker id.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

#include <fmt/format.h>

namespace psched {

// A value of `Rep` that only compares with values of the same `Tag`.
template <typename Tag, typename Rep>
struct Strong {
  Rep value{};

  constexpr Strong() = default;
  constexpr explicit Strong(Rep v) : value(v) {}
  constexpr auto operator<=>(const Strong&) const = default;
};

// Identifies a trainer process within a job; 0 .. workers-1.
using WorkerId = Strong<struct WorkerIdTag, uint32_t>;
// Identifies a shard within a deployment; 0 .. shards-1 in config order.
using ShardId = Strong<struct ShardIdTag, uint32_t>;
// A shard-local handle for a registered variable, returned by register.
using VariableId = Strong<struct VariableIdTag, uint32_t>;

// Training step of an update. Steps are 1-based: step s is the s-th update a worker pushes to a
// variable; Step() (step 0) names the initial value. Steps compare and count up, nothing else;
// fmt prints them as their number.
struct Step : Strong<struct StepTag, uint64_t> {
  using Strong::Strong;
  // The step after this one.
  constexpr Step next() const { return Step(value + 1); }
};
// What a pushed gradient is, as a shard's adaptive optimizers see it: a value for every
// element this step (full width, bf16, fp16, onebit), or sparse: a few elements, each carrying
// the gradients error feedback held back for it over earlier steps (topk). A sparse gradient
// is applied with the optimizer's variance frozen (optim::apply; docs/compression.md).
enum class PushedGradient : uint8_t {
  whole,
  sparse,
};

// Lower value = more urgent. Default: registration order (layer nearest the input first). An
// ordering key: it only compares.
using Priority = Strong<struct PriorityTag, int64_t>;

}  // namespace psched

template <typename Tag, typename Rep>
struct std::hash<psched::Strong<Tag, Rep>> {
  size_t operator()(const psched::Strong<Tag, Rep>& s) const noexcept {
    return std::hash<Rep>{}(s.value);
  }
};

template <>
struct fmt::formatter<psched::Step> : fmt::formatter<uint64_t> {
  auto format(psched::Step step, fmt::format_context& ctx) const {
    return fmt::formatter<uint64_t>::format(step.value, ctx);
  }
};
