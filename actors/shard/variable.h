// SPDX-License-Identifier: Apache-2.0
// Variable: one shard's part of a variable with its optimizer state and update bookkeeping.
// A plain value type owned by a VariableShard (and so touched only on that shard's loop).
//
// Steps: a worker's updates to a variable are numbered 1, 2, ...; step 0 is the initial value.
// async: each partition is applied on arrival; a worker's step s is complete when its pushes
//   of step s covered the whole part. Its next push must be of step s+1.
// bounded: as async; the shard holds a poll for step s until others_reached(s).
// sync: partitions of step s are summed per element; an element range is applied (the mean of
//   the gradients pushed into it) as soon as every worker step s waits for pushed it; step s is
//   complete when the whole part is applied. Pushes of step s+1 are accepted only after that.
//   The workers a step waits for are the shard's Membership's (actors/shard/membership.h);
//   without one, all `workers`, always.
//
// Exactly once: a push of a range the worker already pushed for that step (a retry after a
// lost connection) is a duplicate: acknowledged, never applied again. A push that overlaps a
// received range only in part is an error, as retries resend the same partitions.
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
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/shard/membership.h"
#include "actors/shard/variable_spec.h"
#include "common/aligned_buffer.h"
#include "common/byte_codec.h"
#include "common/fork_join_pool.h"
#include "common/interval_set.h"
#include "common/policies.h"
#include "optim/device.h"

namespace psched {

// The worker id under which sync-mode progress (the aggregate of all workers) is tracked.
inline constexpr WorkerId kAllWorkers{UINT32_MAX};

// Ranges of one step whose update became applied.
struct AppliedRanges {
  Step step;
  std::vector<ElementRange> ranges;
};

// A range of a sync step applied from fewer gradients than the job has workers: who gave them.
struct ShortHanded {
  std::string variable;  // its name (the shard fills it in)
  Step step;
  ElementRange range;
  std::vector<uint32_t> workers;  // ascending
};

// What a push did.
struct PushOutcome {
  bool duplicate = false;             // a retry of received data: acknowledged, not applied
  std::vector<ElementRange> applied;  // ranges whose update for the step became applied
};

class Variable {
 public:
  // `initial` holds part.size() elements of spec.dtype. Updates of more than
  // kParallelApplyElements run on `apply_pool` when given (it outlives the variable). With
  // `device` (which outlives the variable) the optimizer state lives on that device and updates
  // run there; the value is kept both there and here, for reads. Throws psched::Error
  // (overloaded) when the device has no room.
  // In sync mode `membership` (which outlives the variable; its workers() are `workers`) says
  // which workers a step waits for; null: all of them.
  Variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial, Mode mode,
           uint32_t workers, ForkJoinPool* apply_pool = nullptr,
           optim::ComputeDevice* device = nullptr, const Membership* membership = nullptr);

  static constexpr uint64_t kParallelApplyElements = 1 << 18;

  // What save() writes: 1 before the frozen variance's bookkeeping, 2 since.
  static constexpr uint32_t kSaveFormat = 2;
  // Writes everything the variable holds (spec, value, optimizer state, progress) so that
  // restore() rebuilds an equal variable.
  void save(ByteWriter& out) const;
  // Reads what save() wrote in `format` (1 or kSaveFormat); throws Error(corrupt_checkpoint)
  // when it does not fit `mode` and `workers` or is malformed.
  static Variable restore(ByteReader& in, uint32_t format, Mode mode, uint32_t workers,
                          ForkJoinPool* apply_pool = nullptr,
                          optim::ComputeDevice* device = nullptr,
                          const Membership* membership = nullptr);

  const VariableSpec& spec() const { return spec_; }
  ElementRange part() const { return part_; }

  // Validates, then applies (async) or accumulates (sync) one partition of `worker`'s gradient
  // for `step`. `data` holds range.size() elements of `dtype` and is only read. The outcome's
  // ranges are those whose step-`step` update became applied by this push, under the owner
  // polls wait on (the worker in async mode, kAllWorkers in sync mode). Throws psched::Error on
  // bad input and then changes nothing.
  PushOutcome push(WorkerId worker, Step step, ElementRange range, DType dtype,
                   std::span<const std::byte> data,
                   PushedGradient gradient = PushedGradient::whole);
  // The validation push() does first: throws what it would throw; true when the push is a
  // duplicate (a resent partition already received), which push() acknowledges and ignores.
  bool is_duplicate(WorkerId worker, Step step, ElementRange range, DType dtype,
                    std::span<const std::byte> data) const;
  // push() after its validation: for a caller that acts between the two (the shard logs the
  // push). is_duplicate() must have returned false for the same arguments, with nothing pushed
  // since.
  std::vector<ElementRange> push_checked(WorkerId worker, Step step, ElementRange range,
                                         std::span<const std::byte> data, PushedGradient gradient);

  // The part of `range` whose update for `step` is not applied yet (empty: answer at once).
  // Throws on a range outside the part or a step from the future.
  IntervalSet not_yet_applied(WorkerId worker, Step step, ElementRange range) const;

  // sync: whether some worker pushed part of the step after the last complete one.
  bool step_in_progress() const;
  // sync: the workers that have not pushed all of the step in progress, ascending.
  std::vector<uint32_t> missing_workers() const;
  // sync: completes the step in progress without the missing workers. Each element not yet
  // applied gets the mean of the gradients of the workers that pushed it; an element nobody
  // pushed keeps its value and optimizer state. Returns the ranges polls may now be answered
  // for (all of the part that was not applied).
  std::vector<ElementRange> complete_step_without_missing();

  // sync, after the membership changed: applies what the step in progress now has from every
  // worker it waits for, and completes steps that wait for nobody unchanged, one after another.
  // Returns what became applied, step by step.
  std::vector<AppliedRanges> settle();
  // sync: the ranges applied short-handed since the last call (only with a membership).
  std::vector<ShortHanded> take_short_handed() { return std::exchange(short_handed_, {}); }
  // bounded: whether a poll for `step` may be answered as far as the others go: every member
  // that joined at or before step - staleness pushed that step here.
  bool others_reached(Step step, uint64_t staleness) const {
    return behind(step, staleness).empty();
  }
  // bounded: the members that hold a poll for `step` back (ascending).
  std::vector<uint32_t> behind(Step step, uint64_t staleness) const;
  // async, bounded: `worker` goes on from step `completed` + 1 (a worker that rejoins skips the
  // steps it missed); what it pushed of a step up to `completed` is forgotten.
  void skip_to(WorkerId worker, Step completed);
  // sync: the step a push began or completed last (the step in progress, else the last
  // complete one).
  Step begun_step() const { return step_in_progress() ? sync_.completed.next() : sync_.completed; }

  // The owner a poll from `worker` waits on.
  WorkerId poll_owner(WorkerId worker) const { return mode_ == Mode::sync ? kAllWorkers : worker; }
  // The last complete step of the owner of `worker`'s polls.
  Step applied_step(WorkerId worker) const;
  // The newest complete step: the aggregate's (sync) or the furthest worker's (async).
  Step latest_step() const;

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
  // Throws offset_out_of_range unless `range` is non-empty and inside the part; `what` says
  // which request it was ("push", "poll", ...).
  void check_range(const char* what, ElementRange range) const;

 private:
  struct WorkerProgress {  // async mode
    Step completed;
    IntervalSet received;  // of step completed + 1
    uint64_t t = 0;        // update count given to step completed + 1 (0: not started)
  };
  struct SyncProgress {
    Step completed;
    std::vector<IntervalSet> received;  // of step completed + 1, per worker
    IntervalSet applied;                // of step completed + 1
    IntervalSet sparse;                 // of step completed + 1: some push was sparse
    AlignedBuffer sum;  // gradient sums of step completed + 1 where received (else stale)
  };

  // is_duplicate() against the owner's progress: `completed` and what it `received` since.
  bool is_duplicate_given(WorkerId worker, Step step, ElementRange range, DType dtype,
                          std::span<const std::byte> data, Step completed,
                          const IntervalSet& received) const;
  std::vector<ElementRange> push_async(WorkerId worker, Step step, ElementRange range,
                                       std::span<const std::byte> data, PushedGradient gradient);
  std::vector<ElementRange> push_sync(WorkerId worker, Step step, ElementRange range,
                                      std::span<const std::byte> data, PushedGradient gradient);
  // A piece of a range that the same workers pushed all of in the step in progress.
  struct CoveredPiece {
    ElementRange range;
    uint32_t pushers = 0;   // how many workers (but the one excluded) pushed it
    bool complete = false;  // every worker the step waits for (but the one excluded) pushed it
  };
  // `range` cut where a worker's received ranges begin or end, each piece with how many
  // workers other than `except` pushed it (kAllWorkers: count them all) and whether it is
  // complete for `step`, the step in progress.
  std::vector<CoveredPiece> coverage(ElementRange range, WorkerId except, Step step) const;
  // Whether step `step` waits for `worker`; whether steps may apply at all.
  bool expects(WorkerId worker, Step step) const;
  bool quorum() const { return membership_ == nullptr || membership_->quorum(); }
  // Throws unless `worker` may push step `step` (sync): a worker the step does not wait for
  // gets stale_step when it closed or goes on without it, not_a_member when it left the job.
  void check_expected(WorkerId worker, Step step) const;
  [[noreturn]] void fail_not_a_member(WorkerId worker, Step step) const;
  // sync: the part of the step in progress not applied yet.
  IntervalSet not_applied() const;
  // Applies the mean of the sums gathered for `piece` (its pushers' gradients), when any.
  void apply_gathered(const CoveredPiece& piece, Step step);
  // Keeps who gave `range` of `step` when fewer than all workers did; `pusher` besides those
  // in sync_.received (kAllWorkers: none).
  void note_contributors(Step step, ElementRange range, uint32_t gradients, WorkerId pusher);
  // Step `step` is complete: its bookkeeping starts afresh for the next one.
  void finish_step(Step step);
  // Into sync_.sum: `grad` copied (the piece's first pusher) or added.
  void accumulate(ElementRange range, const std::byte* grad, bool first);
  // Applies the mean of sync_.sum (the sum of `others` pushers' gradients) and `grad`: the
  // last pusher's. With no others, straight from `grad`.
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
  Mode mode_;
  uint32_t workers_;
  ForkJoinPool* apply_pool_;
  AlignedBuffer value_;               // part_.size() elements
  std::vector<AlignedBuffer> state_;  // optimizer slots, each like value_; empty with device_
  std::unique_ptr<optim::DeviceVariable> device_;  // value and state on a device, or null
  uint64_t updates_ = 0;       // async: updates started so far (the optimizer's t)
  uint64_t last_whole_t_ = 0;  // the latest t applied from whole gradients (0: none yet)
  std::unordered_map<WorkerId, WorkerProgress> progress_;  // async
  SyncProgress sync_;
  const Membership* membership_;           // sync; null: every worker, always
  std::vector<ShortHanded> short_handed_;  // not yet taken
};

}  // namespace psched
