// SPDX-License-Identifier: Apache-2.0
// StepTrack: where one variable part's steps stand, as its shard's StepMachine keeps it
// (actors/shard/step_machine.h). It decides, for any kind of variable, which of a push's
// pieces a kind gathers and which it applies now, when a step is complete, what a poll still
// waits for, and who holds a step back; the kind (a dense Variable, actors/shard/variable.h)
// only keeps values, optimizer state and sums and does what the track's StepUpdate says.
//
// Steps: a worker's updates to a variable are numbered 1, 2, ...; step 0 is the initial value.
// The extent is the part's element range (a kind whose updates are not element ranges tracks
// a range of its own units the same way).
// async, bounded: each push is applied on arrival; a worker's step s is complete when its
//   pushes of step s covered the whole extent. Its next push must be of step s + 1.
// sync: pushes of step s are gathered per element; an element range applies (the mean of the
//   gradients pushed into it) as soon as every worker step s waits for pushed it; step s is
//   complete when the whole extent is applied, and pushes of step s + 1 are accepted only then.
//   The workers a step waits for are the Membership's (actors/shard/membership.h); without
//   one, all `workers`, always.
//
// Exactly once: a push of a range the worker already pushed for that step (a retry after a
// lost connection) is a duplicate: acknowledged, never applied again. A push that overlaps a
// received range only in part is refused, as retries resend the same partitions.
//
// A plain value type on the shard's loop; `members` (null in async mode) outlives it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/shard/membership.h"
#include "common/byte_codec.h"
#include "common/interval_set.h"
#include "common/placement.h"
#include "common/policies.h"
#include "common/types.h"

namespace psched {

// The worker id under which sync-mode progress (the aggregate of all workers) is tracked.
inline constexpr WorkerId kAllWorkers{UINT32_MAX};

// A range of a sync step applied from fewer gradients than the job has workers: who gave them.
struct ShortHanded {
  std::string variable;  // its name
  Step step;
  ElementRange range;
  std::vector<uint32_t> workers;  // ascending
};

// A piece of an update: a range that the same workers pushed all of.
struct StepPiece {
  ElementRange range;
  // The workers whose gradients of it the kind has gathered (a push: besides the pusher's).
  uint32_t pushers = 0;
  // Whether it applies now (else a push's piece is gathered).
  bool complete = false;
};

// What the track decided about one update of its variable, for the kind to carry out.
struct StepUpdate {
  Step step;
  uint64_t t = 0;  // the optimizer's update number for it (sync: the step)
  // sync: the pieces are gathered across workers and applied as their mean.
  bool gathered = false;
  // The step is complete once these pieces are applied (a kind forgets its step's sums then).
  bool closes = false;
  std::vector<StepPiece> pieces;
};

class StepTrack {
 public:
  // `name` names the variable in messages; `extent` is what a step must cover.
  StepTrack(std::string name, ElementRange extent, Mode mode, uint32_t workers,
            const Membership* members);

  const std::string& name() const { return name_; }
  ElementRange extent() const { return extent_; }

  // Throws unless `worker` may push `range` of `step` (a step from the future, a partial
  // overlap with what it pushed of the step, a worker the step does not wait for); true when
  // the push is a duplicate, which the shard acknowledges and ignores.
  bool is_duplicate(WorkerId worker, Step step, ElementRange range) const;
  // Takes a push that is_duplicate() admitted (returned false): the pieces of `range` the kind
  // gathers or applies, in order.
  StepUpdate receive(WorkerId worker, Step step, ElementRange range);

  // The part of `range` whose update for `step` is not applied yet for `worker`'s polls
  // (empty: answer at once). Throws step_from_future for a step beyond the next one.
  IntervalSet not_yet_applied(WorkerId worker, Step step, ElementRange range) const;

  // sync: whether some worker pushed part of the step after the last complete one.
  bool step_in_progress() const;
  // Whether no step is part-way: nothing is received of a step not complete, by any worker (a
  // checkpoint taken between steps, which psched reshard can place anew).
  bool between_steps() const;
  // sync: the workers that have not pushed all of the step in progress, ascending.
  std::vector<uint32_t> missing_workers() const;
  // sync: completes the step in progress without the missing workers: every range not yet
  // applied, as a complete piece (one nobody pushed has no pushers and stays unchanged).
  StepUpdate complete_without_missing();
  // sync, after the membership changed: applies what the step in progress now has from every
  // worker it waits for, and completes steps that wait for nobody unchanged, one after another.
  std::vector<StepUpdate> settle();

  // bounded: the members that hold a poll for `step` back (ascending): those that joined at
  // or before step - staleness and have not pushed that step here.
  std::vector<uint32_t> behind(Step step, uint64_t staleness) const;
  // async, bounded: `worker` goes on from step `completed` + 1 (a worker that rejoins skips the
  // steps it missed); what it pushed of a step up to `completed` is forgotten.
  void skip_to(WorkerId worker, Step completed);

  // sync: the step a push began or completed last (the step in progress, else the last
  // complete one).
  Step begun_step() const { return step_in_progress() ? sync_.completed.next() : sync_.completed; }
  // The mode the track's steps follow (its variable's, StepRule).
  Mode mode() const { return mode_; }
  // The owner a poll from `worker` waits on: the worker itself, or kAllWorkers in sync mode.
  WorkerId poll_owner(WorkerId worker) const { return mode_ == Mode::sync ? kAllWorkers : worker; }
  // The last complete step of the owner of `worker`'s polls.
  Step applied_step(WorkerId worker) const;
  // The newest complete step: the aggregate's (sync) or the furthest worker's (async).
  Step latest_step() const;
  // The ranges applied short-handed since the last call (only with a membership).
  std::vector<ShortHanded> take_short_handed() { return std::exchange(short_handed_, {}); }

  // What a checkpoint keeps of the track (the layout a Variable record held before the two
  // were apart: its update count, each worker's progress, the sync step's).
  void save(ByteWriter& out) const;
  void load(ByteReader& in);

 private:
  struct WorkerProgress {  // async, bounded
    Step completed;
    IntervalSet received;  // of step completed + 1
    uint64_t t = 0;        // update number given to step completed + 1 (0: not started)
  };
  struct SyncProgress {
    Step completed;
    std::vector<IntervalSet> received;  // of step completed + 1, per worker
    IntervalSet applied;                // of step completed + 1
  };

  // is_duplicate() against the owner's progress: `completed` and what it `received` since.
  bool is_duplicate_given(WorkerId worker, Step step, ElementRange range, Step completed,
                          const IntervalSet& received) const;
  StepUpdate receive_async(WorkerId worker, Step step, ElementRange range);
  StepUpdate receive_sync(WorkerId worker, Step step, ElementRange range);
  // `range` cut where a worker's received ranges begin or end, each piece with how many
  // workers other than `except` pushed it (kAllWorkers: count them all) and whether it is
  // complete for `step`, the step in progress.
  std::vector<StepPiece> coverage(ElementRange range, WorkerId except, Step step) const;
  // Whether step `step` waits for `worker`; whether steps may apply at all.
  bool expects(WorkerId worker, Step step) const;
  bool quorum() const { return members_ == nullptr || members_->quorum(); }
  // Throws unless `worker` may push step `step` (sync): a worker the step does not wait for
  // gets stale_step when it closed or goes on without it, not_a_member when it left the job.
  void check_expected(WorkerId worker, Step step) const;
  [[noreturn]] void fail_not_a_member(WorkerId worker, Step step) const;
  // sync: the part of the step in progress not applied yet.
  IntervalSet not_applied() const;
  // Keeps who gave `piece` of `step` when fewer than all workers did; `pusher` besides those
  // in sync_.received (kAllWorkers: none).
  void note_contributors(Step step, const StepPiece& piece, WorkerId pusher);
  // sync: `applied` ranges of the step in progress are applied; closes the step when that
  // completes the extent.
  bool mark_applied(Step step, const std::vector<StepPiece>& applied);

  std::string name_;
  ElementRange extent_;
  Mode mode_;
  uint32_t workers_;
  const Membership* members_;                              // null: every worker, always
  uint64_t updates_ = 0;                                   // async: updates started so far
  std::unordered_map<WorkerId, WorkerProgress> progress_;  // async, bounded
  SyncProgress sync_;
  std::vector<ShortHanded> short_handed_;  // not yet taken
};

}  // namespace psched
