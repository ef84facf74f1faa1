// SPDX-License-Identifier: Apache-2.0
// Variable: one shard's part of a dense variable with its optimizer state: the values, and the
// sums a sync step gathers. A kind of variable (actors/shard/hosted_kind.h) owned by a
// VariableShard, and so touched only on that shard's loop; its units are the part's elements.
//
// When an update applies is not the variable's to decide: its shard's StepMachine keeps each
// variable's steps (actors/shard/step_track.h) and says, for every accepted push, which pieces
// of it the variable gathers and which it applies now, with which optimizer update number
// (a StepUpdate); after a membership change or a timeout it says which gathered pieces apply.
// The variable checks what is its own to check (dtype, range, bytes) and does what it is told.
//
// Sparse gradients (PushedGradient::sparse, topk pushes) are applied with the adaptive
// optimizers' variance frozen as the last update by whole gradients left it
// (optim::apply's variance_frozen_after), so that the update is linear in the gradient and
// error feedback's late parts land at full weight (1-bit Adam's answer). Before any whole
// update there is no variance to freeze, and sparse ones update it as whole ones do. In sync
// mode an element range's update is sparse when any worker's push summed into it was.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "actors/shard/hosted_kind.h"
#include "actors/shard/step_track.h"
#include "actors/shard/value_deltas.h"
#include "actors/shard/variable_spec.h"
#include "common/aligned_buffer.h"
#include "common/byte_codec.h"
#include "common/fork_join_pool.h"
#include "common/interval_set.h"
#include "optim/device.h"

namespace psched {

class Variable final : public HostedKind {
 public:
  // `initial` holds part.size() elements of spec.dtype. Updates of more than
  // kParallelApplyElements run on `apply_pool` when given (it outlives the variable). With
  // `device` (which outlives the variable) the optimizer state lives on that device and updates
  // run there; the value is kept both there and here, for reads. Throws psched::Error
  // (overloaded) when the device has no room.
  Variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
           ForkJoinPool* apply_pool = nullptr, optim::ComputeDevice* device = nullptr);

  static constexpr uint64_t kParallelApplyElements = 1 << 18;

  // Throws unless a variable can be made of `part` of `spec` with `initial`: a part inside its
  // elements, an initial value of the part's size, an optimizer whose settings hold.
  static void check_part(const VariableSpec& spec, ElementRange part,
                         std::span<const std::byte> initial);

  const VariableSpec& spec() const { return spec_; }
  ElementRange part() const { return part_; }

  // HostedKind. check_push: the dtype it was registered with, a range inside the part, whole
  // elements for the range (the units: the range). check_poll: a non-empty range inside the
  // part. take: each of the update's pieces is gathered into the step's sums or applied (the
  // mean of its gathered gradients and this one). read and view: the range's current values.
  KindTag tag() const override { return KindTag::variable; }
  const std::string& name() const override { return spec_.name; }
  Priority priority() const override { return spec_.priority; }
  DType dtype() const override { return spec_.dtype; }
  ElementRange extent() const override { return part_; }
  StepRule step_rule(const ShardSettings& settings) const override { return settings.dense_rule(); }
  ElementRange check_push(const Push& push) const override;
  ElementRange check_poll(const char* what, const Poll& poll) const override;
  void take(const StepUpdate& update, const Push& push) override;
  void apply_gathered(const StepUpdate& update) override;
  uint64_t answer_bytes(const Poll& poll) const override;
  void read(const Poll& poll, std::span<std::byte> out) const override;
  std::span<const std::byte> view(const Poll& poll) const override { return view(poll.range); }
  // Its fresh values as deltas (`pull: topk`): published copies of the ranges workers poll,
  // told of every update. Not saved in checkpoints: a restored variable starts without.
  ValueDeltas* deltas() override { return &deltas_; }
  void report(ShardStats& stats) const override;
  std::optional<VariableStatus> status(Step step) const override;

  // Copies the current value of `range` (inside the part) to `out`.
  void read(ElementRange range, std::byte* out) const;
  // The current value of `range` (inside the part) where it lives, in host memory (a device
  // variable's apply copies its fresh values back there): changed in place by the next update.
  std::span<const std::byte> view(ElementRange range) const;
  // Copies optimizer state slot `slot` (optimizer.h's slot order) of `range` (inside the part)
  // to `out`, from the device when the state lives on one.
  void read_state(int slot, ElementRange range, std::byte* out) const;
  // The reverse (restoring a checkpoint): overwrites slot `slot` of `range` with `in`.
  void write_state(int slot, ElementRange range, const std::byte* in);

  // What a checkpoint keeps of a variable, in two parts around its StepTrack's (HostedKind):
  // The t of the latest update applied from whole gradients (the frozen variance's
  // bookkeeping, kept with the sums), and setting it: psched reshard carries it to a part it
  // cuts anew.
  uint64_t last_whole_t() const { return last_whole_t_; }
  void set_last_whole_t(uint64_t t) { last_whole_t_ = t; }
  // save_head writes spec, part, value and optimizer state; save_sums the step's sums and the
  // frozen variance's bookkeeping. restore reads what save_head wrote, load_sums the rest;
  // both throw Error(corrupt_checkpoint) when it is malformed.
  void save_head(ByteWriter& out) const override;
  void save_sums(ByteWriter& out) const override;
  static Variable restore(ByteReader& in, ForkJoinPool* apply_pool = nullptr,
                          optim::ComputeDevice* device = nullptr);
  void load_sums(ByteReader& in) override;

 private:
  // Throws offset_out_of_range unless `range` is non-empty and inside the part; `what` says
  // which request it was ("push", "poll", ...).
  void check_range(const char* what, ElementRange range) const;
  // Into sum_: `grad` copied (the piece's first pusher) or added.
  void accumulate(ElementRange range, const std::byte* grad, bool first);
  // Applies the mean of sum_ (the sum of `others` pushers' gradients) and `grad`: the last
  // pusher's. With no others, straight from `grad`.
  void apply_mean(ElementRange range, const std::byte* grad, uint32_t others, uint64_t t,
                  bool sparse);
  // One optimizer update `t` of `range` from `grad` (range.size() elements of the dtype), the
  // variance frozen when `sparse` (and there is one to freeze), split over the apply pool
  // when large.
  void apply(ElementRange range, const std::byte* grad, uint64_t t, bool sparse);
  // optim::apply's variance_frozen_after for update `t`; notes a whole update's t.
  uint64_t variance_frozen_after(uint64_t t, bool sparse);
  // The update on the calling thread.
  void apply_here(ElementRange range, const std::byte* grad, uint64_t t, uint64_t frozen_after);
  // The same on device_, whole; the fresh values are copied back into value_.
  void apply_on_device(ElementRange range, const std::byte* grad, uint64_t t,
                       uint64_t frozen_after);

  VariableSpec spec_;
  ElementRange part_;
  ForkJoinPool* apply_pool_;
  AlignedBuffer value_;               // part_.size() elements
  std::vector<AlignedBuffer> state_;  // optimizer slots, each like value_; empty with device_
  std::unique_ptr<optim::DeviceVariable> device_;  // value and state on a device, or null
  uint64_t last_whole_t_ = 0;  // the latest t applied from whole gradients (0: none yet)
  // sync: gradient sums of the step in progress where gathered (else stale: never zeroed).
  AlignedBuffer sum_;
  IntervalSet sparse_;  // sync: where some push of the step in progress was sparse
  ValueDeltas deltas_;
};

}  // namespace psched
