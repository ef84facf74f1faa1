// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "actors/durability/state_codec.h"
#include "common/check.h"
#include "common/error.h"

namespace psched {
namespace {

AlignedBuffer filled(size_t elements, DType dtype, double value) {
  AlignedBuffer buffer(elements * element_bytes(dtype));
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (T& x : buffer.as<T>()) x = static_cast<T>(value);
  });
  return buffer;
}

}  // namespace

Variable::Variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                   ForkJoinPool* apply_pool, optim::ComputeDevice* device)
    : spec_(std::move(spec)),
      part_(part),
      apply_pool_(apply_pool),
      value_(part.size() * element_bytes(spec_.dtype)) {
  PSCHED_REQUIRE(initial.size() == value_.size(), initial.size(), value_.size());
  std::memcpy(value_.data(), initial.data(), initial.size());
  if (device != nullptr) device_ = device->allocate(spec_.optimizer, spec_.dtype, initial);
  for (int slot = 0; !device_ && slot < optim::state_slots(spec_.optimizer); ++slot)
    state_.push_back(
        filled(part.size(), spec_.dtype, optim::initial_state_value(spec_.optimizer, slot)));
}

void Variable::check_part(const VariableSpec& spec, ElementRange part,
                          std::span<const std::byte> initial) {
  if (part.begin >= part.end || part.end > spec.elements())
    fail(ErrorCode::offset_out_of_range,
         "register of variable '{}' rejected: part [{}, {}) does not fit its {} elements",
         spec.name, part.begin, part.end, spec.elements());
  if (initial.size() != part.size() * element_bytes(spec.dtype))
    fail(ErrorCode::shape_mismatch,
         "register of variable '{}' rejected: initial value has {} bytes, expected {} ({} "
         "elements of {})",
         spec.name, initial.size(), part.size() * element_bytes(spec.dtype), part.size(),
         to_string(spec.dtype));
  optim::validate(spec.optimizer);
}

void Variable::check_range(const char* what, ElementRange range) const {
  if (range.begin >= range.end)
    fail(ErrorCode::offset_out_of_range, "{} to variable '{}' rejected: empty range at offset {}",
         what, spec_.name, range.begin);
  if (!part_.contains(range))
    fail(ErrorCode::offset_out_of_range,
         "{} to variable '{}' rejected: elements [{}, {}) are outside this shard's part [{}, {}) "
         "of size {}",
         what, spec_.name, range.begin, range.end, part_.begin, part_.end, spec_.elements());
}

ElementRange Variable::check_push(const Push& push) const {
  if (push.rows)
    fail(ErrorCode::unknown_variable,
         "push of rows rejected: id {} is dense variable '{}', not a table", push.variable.value,
         spec_.name);
  if (push.dtype != spec_.dtype)
    fail(ErrorCode::dtype_mismatch, "push to variable '{}' rejected: dtype {} but registered as {}",
         spec_.name, to_string(push.dtype), to_string(spec_.dtype));
  check_range("push", push.range);
  const uint64_t expected = push.range.size() * element_bytes(push.dtype);
  if (push.data.size() != expected)
    fail(ErrorCode::shape_mismatch,
         "push to variable '{}' rejected: {} bytes for {} elements of {} (expected {})", spec_.name,
         push.data.size(), push.range.size(), to_string(push.dtype), expected);
  return push.range;
}

ElementRange Variable::check_poll(const char* what, const Poll& poll) const {
  if (poll.rows)
    fail(ErrorCode::unknown_variable,
         "pull of rows rejected: id {} is dense variable '{}', not a table", poll.variable.value,
         spec_.name);
  check_range(what, poll.range);
  return poll.range;
}

void Variable::take(const StepUpdate& update, const Push& push) {
  // One pass per piece: the first pusher's gradient is copied into the sum, later ones added,
  // and the last one's add, the mean and the apply go together (one worker, or async: straight
  // from the push's data, no sum at all). So the sum never needs zeroing between steps.
  const bool sparse = push.gradient == PushedGradient::sparse;
  for (const StepPiece& piece : update.pieces) {
    const std::byte* grad =
        push.data.data() + (piece.range.begin - push.range.begin) * element_bytes(spec_.dtype);
    if (piece.complete)
      apply_mean(piece.range, grad, piece.pushers, update.t,
                 sparse || sparse_.overlaps(piece.range));
    else
      accumulate(piece.range, grad, piece.pushers == 0);
  }
  if (!update.gathered) return;
  if (sparse) sparse_.add(push.range);
  if (update.closes) sparse_.clear();
}

void Variable::apply_gathered(const StepUpdate& update) {
  for (const StepPiece& piece : update.pieces) {
    if (!piece.complete || piece.pushers == 0) continue;
    visit_dtype(spec_.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* sum = sum_.as<T>().data() + (piece.range.begin - part_.begin);
      const T scale = T(1) / static_cast<T>(piece.pushers);  // as apply_mean scales
      for (uint64_t k = 0; k < piece.range.size(); ++k) sum[k] *= scale;
      apply(piece.range, reinterpret_cast<const std::byte*>(sum), update.t,
            sparse_.overlaps(piece.range));
    });
  }
  if (update.closes) sparse_.clear();
}

void Variable::accumulate(ElementRange range, const std::byte* grad, bool first) {
  if (sum_.size() == 0) sum_ = filled(part_.size(), spec_.dtype, 0.0);  // once
  size_t bytes = element_bytes(spec_.dtype);
  std::byte* sum = sum_.data() + (range.begin - part_.begin) * bytes;
  if (first) {
    std::memcpy(sum, grad, range.size() * bytes);
    return;
  }
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* s = reinterpret_cast<T*>(sum);
    const T* g = reinterpret_cast<const T*>(grad);
    for (uint64_t i = 0; i < range.size(); ++i) s[i] += g[i];
  });
}

void Variable::apply_mean(ElementRange range, const std::byte* grad, uint32_t others, uint64_t t,
                          bool sparse) {
  if (others == 0) return apply(range, grad, t, sparse);
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* s = sum_.as<T>().data() + (range.begin - part_.begin);
    const T* g = reinterpret_cast<const T*>(grad);
    const T scale = T(1) / static_cast<T>(others + 1);
    for (uint64_t i = 0; i < range.size(); ++i) s[i] = (s[i] + g[i]) * scale;
    apply(range, reinterpret_cast<const std::byte*>(s), t, sparse);
  });
}

uint64_t Variable::variance_frozen_after(uint64_t t, bool sparse) {
  if (!sparse) {
    last_whole_t_ = std::max(last_whole_t_, t);
    return 0;
  }
  return std::min(last_whole_t_, t - 1);  // async: another worker's later t may be whole
}

void Variable::apply(ElementRange range, const std::byte* grad, uint64_t t, bool sparse) {
  uint64_t n = range.size(), frozen_after = variance_frozen_after(t, sparse);
  deltas_.changed(range);
  if (device_) return apply_on_device(range, grad, t, frozen_after);
  if (apply_pool_ == nullptr || apply_pool_->width() == 1 || n <= kParallelApplyElements)
    return apply_here(range, grad, t, frozen_after);
  // Element-wise kernels: disjoint pieces give exactly the whole range's result.
  uint64_t pieces = apply_pool_->width(), piece = (n + pieces - 1) / pieces;
  size_t bytes = element_bytes(spec_.dtype);
  apply_pool_->run(pieces, [&](size_t i) {
    uint64_t begin = std::min(n, i * piece), end = std::min(n, begin + piece);
    apply_here({range.begin + begin, range.begin + end}, grad + begin * bytes, t, frozen_after);
  });
}

void Variable::apply_on_device(ElementRange range, const std::byte* grad, uint64_t t,
                               uint64_t frozen_after) {
  size_t bytes = element_bytes(spec_.dtype);
  uint64_t local = range.begin - part_.begin, n = range.size();
  device_->apply(local, {grad, n * bytes}, t, frozen_after,
                 value_.bytes().subspan(local * bytes, n * bytes));
}

void Variable::apply_here(ElementRange range, const std::byte* grad, uint64_t t,
                          uint64_t frozen_after) {
  uint64_t local = range.begin - part_.begin, n = range.size();
  if (n == 0) return;
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    std::array<std::span<T>, 3> slots;
    for (size_t k = 0; k < state_.size(); ++k) slots[k] = state_[k].as<T>().subspan(local, n);
    optim::apply(spec_.optimizer, value_.as<T>().subspan(local, n),
                 std::span<const T>(reinterpret_cast<const T*>(grad), n),
                 std::span<const std::span<T>>(slots.data(), state_.size()), t, frozen_after);
  });
}

uint64_t Variable::answer_bytes(const Poll& poll) const {
  return poll.range.size() * element_bytes(spec_.dtype);
}

void Variable::read(const Poll& poll, std::span<std::byte> out) const {
  PSCHED_REQUIRE(out.size() == answer_bytes(poll), out.size(), poll.range.size());
  read(poll.range, out.data());
}

void Variable::report(ShardStats& stats) const {
  ++stats.variables;
  stats.delta_pulls.published += deltas_.published();
  stats.delta_pulls.held_bytes += deltas_.bytes();
}

std::optional<VariableStatus> Variable::status(Step step) const {
  return VariableStatus{spec_.name, part_, step};
}

void Variable::read(ElementRange range, std::byte* out) const {
  size_t bytes = element_bytes(spec_.dtype);
  std::memcpy(out, value_.data() + (range.begin - part_.begin) * bytes, range.size() * bytes);
}

std::span<const std::byte> Variable::view(ElementRange range) const {
  size_t bytes = element_bytes(spec_.dtype);
  return {value_.data() + (range.begin - part_.begin) * bytes, range.size() * bytes};
}

void Variable::save_head(ByteWriter& out) const {
  encode(out, spec_);
  encode(out, part_);
  out.blob(value_.bytes());
  int slots = optim::state_slots(spec_.optimizer);
  out.put<uint64_t>(slots);
  std::vector<std::byte> state(value_.size());
  for (int slot = 0; slot < slots; ++slot) {
    read_state(slot, part_, state.data());  // from the device when it holds the state
    out.blob(state);
  }
}

void Variable::save_sums(ByteWriter& out) const {
  out.blob(sum_.bytes());
  out.put(last_whole_t_);
  encode(out, sparse_);
}

Variable Variable::restore(ByteReader& in, ForkJoinPool* apply_pool, optim::ComputeDevice* device) {
  VariableSpec spec = decode_spec(in);
  ElementRange part = decode_range(in);
  if (part.end > spec.elements() || part.begin >= part.end)
    fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has part [{}, {}) of {} elements",
         in.what(), spec.name, part.begin, part.end, spec.elements());
  auto value = in.blob();
  if (value.size() != part.size() * element_bytes(spec.dtype))
    fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has {} bytes of value where {} fit",
         in.what(), spec.name, value.size(), part.size() * element_bytes(spec.dtype));
  Variable v(std::move(spec), part, value, apply_pool, device);
  int slots = optim::state_slots(v.spec_.optimizer);
  if (in.get<uint64_t>() != static_cast<uint64_t>(slots))
    fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has the wrong number of optimizer slots",
         in.what(), v.spec_.name);
  for (int slot = 0; slot < slots; ++slot) {
    auto blob = in.blob();
    if (blob.size() != v.value_.size())
      fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has {} bytes of optimizer state",
           in.what(), v.spec_.name, blob.size());
    v.write_state(slot, part, blob.data());
  }
  return v;
}

void Variable::load_sums(ByteReader& in) {
  auto sum = in.blob();
  if (!sum.empty()) {
    if (sum.size() != value_.size())
      fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has {} bytes of gradient sums",
           in.what(), spec_.name, sum.size());
    sum_ = AlignedBuffer(sum.size());
    std::memcpy(sum_.data(), sum.data(), sum.size());
  }
  last_whole_t_ = in.get<uint64_t>();
  sparse_ = decode_intervals(in);
}

void Variable::read_state(int slot, ElementRange range, std::byte* out) const {
  PSCHED_REQUIRE(slot >= 0 && slot < optim::state_slots(spec_.optimizer), slot);
  PSCHED_REQUIRE(part_.contains(range), range.begin, range.end, part_.begin, part_.end);
  size_t bytes = element_bytes(spec_.dtype), local = range.begin - part_.begin;
  if (device_) return device_->read_state(slot, local, {out, range.size() * bytes});
  std::memcpy(out, state_[slot].data() + local * bytes, range.size() * bytes);
}

void Variable::write_state(int slot, ElementRange range, const std::byte* in) {
  PSCHED_REQUIRE(slot >= 0 && slot < optim::state_slots(spec_.optimizer), slot);
  PSCHED_REQUIRE(part_.contains(range), range.begin, range.end, part_.begin, part_.end);
  size_t bytes = element_bytes(spec_.dtype), local = range.begin - part_.begin;
  if (device_) return device_->write_state(slot, local, {in, range.size() * bytes});
  std::memcpy(state_[slot].data() + local * bytes, in, range.size() * bytes);
}

}  // namespace psched
