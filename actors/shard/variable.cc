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
                   Mode mode, uint32_t workers, ForkJoinPool* apply_pool,
                   optim::ComputeDevice* device, const Membership* membership)
    : spec_(std::move(spec)),
      part_(part),
      mode_(mode),
      workers_(workers),
      apply_pool_(apply_pool),
      value_(part.size() * element_bytes(spec_.dtype)),
      membership_(membership) {
  PSCHED_REQUIRE(initial.size() == value_.size(), initial.size(), value_.size());
  PSCHED_REQUIRE(!membership || membership->workers() == workers, workers);
  std::memcpy(value_.data(), initial.data(), initial.size());
  if (device != nullptr) device_ = device->allocate(spec_.optimizer, spec_.dtype, initial);
  for (int slot = 0; !device_ && slot < optim::state_slots(spec_.optimizer); ++slot)
    state_.push_back(
        filled(part.size(), spec_.dtype, optim::initial_state_value(spec_.optimizer, slot)));
  sync_.received.resize(workers);
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

bool Variable::is_duplicate_given(WorkerId worker, Step step, ElementRange range, DType dtype,
                                  std::span<const std::byte> data, Step completed,
                                  const IntervalSet& received) const {
  if (dtype != spec_.dtype)
    fail(ErrorCode::dtype_mismatch, "push to variable '{}' rejected: dtype {} but registered as {}",
         spec_.name, to_string(dtype), to_string(spec_.dtype));
  check_range("push", range);
  if (data.size() != range.size() * element_bytes(dtype))
    fail(ErrorCode::shape_mismatch,
         "push to variable '{}' rejected: {} bytes for {} elements of {} (expected {})", spec_.name,
         data.size(), range.size(), to_string(dtype), range.size() * element_bytes(dtype));
  if (step <= completed) return true;
  if (step > completed.next())
    fail(ErrorCode::step_from_future,
         "push to variable '{}' rejected: step {} from the future (next step is {})", spec_.name,
         step, completed.next());
  if (received.contains(range)) return true;
  if (received.overlaps(range))
    fail(ErrorCode::stale_step,
         "push to variable '{}' rejected: elements [{}, {}) of step {} from worker {} were "
         "partly received already (a retry must resend the same partition)",
         spec_.name, range.begin, range.end, step, worker.value);
  return false;
}

bool Variable::is_duplicate(WorkerId worker, Step step, ElementRange range, DType dtype,
                            std::span<const std::byte> data) const {
  if (mode_ == Mode::sync) {
    if (worker.value >= workers_)
      fail(ErrorCode::invalid_argument,
           "push to variable '{}' rejected: worker {} is not below the job's {} workers",
           spec_.name, worker.value, workers_);
    bool duplicate = is_duplicate_given(worker, step, range, dtype, data, sync_.completed,
                                        sync_.received[worker.value]);
    if (!expects(worker, step)) check_expected(worker, step);
    return duplicate;
  }
  if (membership_ != nullptr && !membership_->is_member(worker)) fail_not_a_member(worker, step);
  static const WorkerProgress kFresh;
  auto it = progress_.find(worker);
  const WorkerProgress& p = it == progress_.end() ? kFresh : it->second;
  return is_duplicate_given(worker, step, range, dtype, data, p.completed, p.received);
}

PushOutcome Variable::push(WorkerId worker, Step step, ElementRange range, DType dtype,
                           std::span<const std::byte> data, PushedGradient gradient) {
  if (is_duplicate(worker, step, range, dtype, data)) return {.duplicate = true};
  return {.applied = push_checked(worker, step, range, data, gradient)};
}

std::vector<ElementRange> Variable::push_checked(WorkerId worker, Step step, ElementRange range,
                                                 std::span<const std::byte> data,
                                                 PushedGradient gradient) {
  if (mode_ == Mode::sync) return push_sync(worker, step, range, data, gradient);
  return push_async(worker, step, range, data, gradient);
}

std::vector<ElementRange> Variable::push_async(WorkerId worker, Step step, ElementRange range,
                                               std::span<const std::byte> data,
                                               PushedGradient gradient) {
  WorkerProgress& p = progress_[worker];
  if (p.t == 0) p.t = ++updates_;
  apply(range, data.data(), p.t, gradient == PushedGradient::sparse);
  p.received.add(range);
  if (p.received.size() == part_.size()) {
    p.completed = step;
    p.received.clear();
    p.t = 0;
  }
  return {range};
}

bool Variable::expects(WorkerId worker, Step step) const {
  return membership_ ? membership_->expects(worker, step) : worker.value < workers_;
}

void Variable::fail_not_a_member(WorkerId worker, Step step) const {
  fail(ErrorCode::not_a_member,
       "push of step {} to variable '{}' rejected: worker {} is no member of the job (its "
       "lease ended or it never joined); join again (the client does on start)",
       step, spec_.name, worker.value);
}

void Variable::check_expected(WorkerId worker, Step step) const {
  Step joined = membership_->joined_at(worker);
  if (joined == Step() && step > sync_.completed) fail_not_a_member(worker, step);
  fail(ErrorCode::stale_step,
       "push of step {} to variable '{}' from worker {} dropped: the step {} without it ({})", step,
       spec_.name, worker.value, step <= sync_.completed ? "closed" : "goes on",
       joined == Step() ? fmt::format("worker {} left the job", worker.value)
                        : fmt::format("worker {} joined at step {}", worker.value, joined));
}

std::vector<uint32_t> Variable::behind(Step step, uint64_t staleness) const {
  std::vector<uint32_t> out;
  if (step.value <= staleness) return out;
  Step needed(step.value - staleness);
  for (uint32_t w = 0; w < workers_; ++w) {
    if (!membership_->expects(WorkerId(w), needed)) continue;
    auto it = progress_.find(WorkerId(w));
    if (it == progress_.end() || it->second.completed < needed) out.push_back(w);
  }
  return out;
}

void Variable::skip_to(WorkerId worker, Step completed) {
  WorkerProgress& p = progress_[worker];
  if (p.completed >= completed) return;
  p = WorkerProgress{.completed = completed};
}

std::vector<ElementRange> Variable::push_sync(WorkerId worker, Step step, ElementRange range,
                                              std::span<const std::byte> data,
                                              PushedGradient gradient) {
  // One pass per piece: the first pusher's gradient is copied into the sum, later ones added,
  // and the last one's add, the mean and the apply go together (one worker: straight from
  // `data`, no sum at all). So the sum never needs zeroing between steps.
  std::vector<ElementRange> applied;
  for (const CoveredPiece& piece : coverage(range, worker, step)) {
    const std::byte* grad =
        data.data() + (piece.range.begin - range.begin) * element_bytes(spec_.dtype);
    if (piece.complete) {
      bool sparse = gradient == PushedGradient::sparse || sync_.sparse.overlaps(piece.range);
      note_contributors(step, piece.range, piece.pushers + 1, worker);
      apply_mean(piece.range, grad, piece.pushers, step.value, sparse);  // t = s
      applied.push_back(piece.range);
    } else {
      accumulate(piece.range, grad, piece.pushers == 0);
    }
  }
  sync_.received[worker.value].add(range);
  if (gradient == PushedGradient::sparse) sync_.sparse.add(range);
  for (ElementRange r : applied) sync_.applied.add(r);
  if (sync_.applied.size() == part_.size()) finish_step(step);
  return applied;
}

void Variable::finish_step(Step step) {
  sync_.completed = step;
  sync_.applied.clear();
  sync_.sparse.clear();
  for (IntervalSet& received : sync_.received) received.clear();
}

void Variable::note_contributors(Step step, ElementRange range, uint32_t gradients,
                                 WorkerId pusher) {
  if (membership_ == nullptr || gradients == workers_) return;
  ShortHanded record{.step = step, .range = range};
  for (uint32_t w = 0; w < workers_; ++w)
    if (w == pusher.value || sync_.received[w].contains(range)) record.workers.push_back(w);
  short_handed_.push_back(std::move(record));
}

std::vector<Variable::CoveredPiece> Variable::coverage(ElementRange range, WorkerId except,
                                                       Step step) const {
  std::vector<uint64_t> cuts{range.begin, range.end};
  for (uint32_t w = 0; w < sync_.received.size(); ++w) {
    if (w == except.value) continue;
    for (ElementRange r : sync_.received[w].ranges()) {
      if (range.begin < r.begin && r.begin < range.end) cuts.push_back(r.begin);
      if (range.begin < r.end && r.end < range.end) cuts.push_back(r.end);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<CoveredPiece> pieces;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    CoveredPiece piece{.range = {cuts[i], cuts[i + 1]}, .complete = quorum()};
    for (uint32_t w = 0; w < sync_.received.size(); ++w) {
      if (w == except.value) continue;
      if (sync_.received[w].contains(piece.range))
        ++piece.pushers;
      else if (expects(WorkerId(w), step))
        piece.complete = false;
    }
    pieces.push_back(piece);
  }
  return pieces;
}

void Variable::accumulate(ElementRange range, const std::byte* grad, bool first) {
  if (sync_.sum.size() == 0) sync_.sum = filled(part_.size(), spec_.dtype, 0.0);  // once
  size_t bytes = element_bytes(spec_.dtype);
  std::byte* sum = sync_.sum.data() + (range.begin - part_.begin) * bytes;
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
    T* s = sync_.sum.as<T>().data() + (range.begin - part_.begin);
    const T* g = reinterpret_cast<const T*>(grad);
    const T scale = T(1) / static_cast<T>(others + 1);
    for (uint64_t i = 0; i < range.size(); ++i) s[i] = (s[i] + g[i]) * scale;
    apply(range, reinterpret_cast<const std::byte*>(s), t, sparse);
  });
}

bool Variable::step_in_progress() const {
  return std::any_of(sync_.received.begin(), sync_.received.end(),
                     [](const IntervalSet& r) { return !r.empty(); });
}

std::vector<uint32_t> Variable::missing_workers() const {
  std::vector<uint32_t> out;
  Step step = sync_.completed.next();
  for (uint32_t w = 0; w < sync_.received.size(); ++w)
    if (expects(WorkerId(w), step) && sync_.received[w].size() != part_.size()) out.push_back(w);
  return out;
}

void Variable::apply_gathered(const CoveredPiece& piece, Step step) {
  if (piece.pushers == 0) return;
  note_contributors(step, piece.range, piece.pushers, kAllWorkers);
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* sum = sync_.sum.as<T>().data() + (piece.range.begin - part_.begin);
    const T scale = T(1) / static_cast<T>(piece.pushers);  // as apply_mean scales
    for (uint64_t k = 0; k < piece.range.size(); ++k) sum[k] *= scale;
    apply(piece.range, reinterpret_cast<const std::byte*>(sum), step.value,
          sync_.sparse.overlaps(piece.range));
  });
}

IntervalSet Variable::not_applied() const {
  IntervalSet open;
  open.add(part_);
  for (ElementRange r : sync_.applied.ranges()) open.subtract(r);
  return open;
}

std::vector<ElementRange> Variable::complete_step_without_missing() {
  IntervalSet open = not_applied();
  Step step = sync_.completed.next();
  for (ElementRange r : open.ranges())
    for (const CoveredPiece& piece : coverage(r, kAllWorkers, step)) apply_gathered(piece, step);
  finish_step(step);
  return open.ranges();
}

std::vector<AppliedRanges> Variable::settle() {
  std::vector<AppliedRanges> out;
  while (quorum()) {
    Step step = sync_.completed.next();
    AppliedRanges applied{.step = step};
    const IntervalSet open = not_applied();
    for (ElementRange r : open.ranges()) {
      for (const CoveredPiece& piece : coverage(r, kAllWorkers, step)) {
        if (!piece.complete) continue;
        apply_gathered(piece, step);
        applied.ranges.push_back(piece.range);
      }
    }
    if (applied.ranges.empty()) break;
    for (ElementRange r : applied.ranges) sync_.applied.add(r);
    out.push_back(std::move(applied));
    if (sync_.applied.size() != part_.size()) break;
    finish_step(step);
  }
  return out;
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

Step Variable::applied_step(WorkerId worker) const {
  if (mode_ == Mode::sync) return sync_.completed;
  auto it = progress_.find(worker);
  return it == progress_.end() ? Step() : it->second.completed;
}

Step Variable::latest_step() const {
  if (mode_ == Mode::sync) return sync_.completed;
  Step latest;
  for (const auto& [worker, progress] : progress_) latest = std::max(latest, progress.completed);
  return latest;
}

IntervalSet Variable::not_yet_applied(WorkerId worker, Step step, ElementRange range) const {
  check_range("poll", range);
  Step completed = applied_step(worker);
  IntervalSet pending;
  if (step <= completed) return pending;
  if (step > completed.next())
    fail(ErrorCode::step_from_future,
         "poll of variable '{}' rejected: step {} from the future (last complete step {})",
         spec_.name, step, completed);
  pending.add(range);
  if (mode_ == Mode::sync) {
    for (ElementRange r : sync_.applied.ranges()) pending.subtract(r);
  } else if (auto it = progress_.find(worker); it != progress_.end()) {
    for (ElementRange r : it->second.received.ranges()) pending.subtract(r);
  }
  return pending;
}

void Variable::read(ElementRange range, std::byte* out) const {
  size_t bytes = element_bytes(spec_.dtype);
  std::memcpy(out, value_.data() + (range.begin - part_.begin) * bytes, range.size() * bytes);
}

std::span<const std::byte> Variable::view(ElementRange range) const {
  size_t bytes = element_bytes(spec_.dtype);
  return {value_.data() + (range.begin - part_.begin) * bytes, range.size() * bytes};
}

void Variable::save(ByteWriter& out) const {
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
  out.put(updates_);
  out.put<uint64_t>(progress_.size());
  for (const auto& [worker, p] : progress_) {
    out.put(worker.value);
    out.put(p.completed.value);
    out.put(p.t);
    encode(out, p.received);
  }
  out.put(sync_.completed.value);
  for (const IntervalSet& received : sync_.received) encode(out, received);
  encode(out, sync_.applied);
  out.blob(sync_.sum.bytes());
  out.put(last_whole_t_);
  encode(out, sync_.sparse);
}

Variable Variable::restore(ByteReader& in, uint32_t format, Mode mode, uint32_t workers,
                           ForkJoinPool* apply_pool, optim::ComputeDevice* device,
                           const Membership* membership) {
  VariableSpec spec = decode_spec(in);
  ElementRange part = decode_range(in);
  if (part.end > spec.elements() || part.begin >= part.end)
    fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has part [{}, {}) of {} elements",
         in.what(), spec.name, part.begin, part.end, spec.elements());
  auto value = in.blob();
  if (value.size() != part.size() * element_bytes(spec.dtype))
    fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has {} bytes of value where {} fit",
         in.what(), spec.name, value.size(), part.size() * element_bytes(spec.dtype));
  Variable v(std::move(spec), part, value, mode, workers, apply_pool, device, membership);
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
  v.updates_ = in.get<uint64_t>();
  uint64_t progressing = in.get<uint64_t>();
  for (uint64_t i = 0; i < progressing; ++i) {
    WorkerId worker(in.get<uint32_t>());
    WorkerProgress& p = v.progress_[worker];
    p.completed = Step(in.get<uint64_t>());
    p.t = in.get<uint64_t>();
    p.received = decode_intervals(in);
  }
  v.sync_.completed = Step(in.get<uint64_t>());
  for (IntervalSet& received : v.sync_.received) received = decode_intervals(in);
  v.sync_.applied = decode_intervals(in);
  auto sum = in.blob();
  if (!sum.empty()) {
    if (sum.size() != v.value_.size())
      fail(ErrorCode::corrupt_checkpoint, "{}: variable '{}' has {} bytes of gradient sums",
           in.what(), v.spec_.name, sum.size());
    v.sync_.sum = AlignedBuffer(sum.size());
    std::memcpy(v.sync_.sum.data(), sum.data(), sum.size());
  }
  if (format == 1) {  // every update then was a whole one
    v.last_whole_t_ = mode == Mode::sync ? v.sync_.completed.value : v.updates_;
    return v;
  }
  v.last_whole_t_ = in.get<uint64_t>();
  v.sync_.sparse = decode_intervals(in);
  return v;
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
