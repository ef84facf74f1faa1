// SPDX-License-Identifier: Apache-2.0
// Membership: which workers a shard's steps wait for in sync and bounded modes (`sync:
// {min_workers, lease_seconds}`, config/deployment.h; the rules in docs/reliability.md).
//
// The job's declared workers (ids 0 .. workers-1) are members from step 1. A member leaves when
// its lease ends (actors/shard/leases.h) or when a new process with its id joins again; a worker
// joins from a step that no variable of the shard has begun (StepMachine::join), so the
// members a step waits for change after its first push only by leaving. Step s of a variable
// waits for the members that joined at or before s, and applies nothing while fewer than
// min_workers workers are members: what a member pushed before it left stays in the step's
// mean (each element averages the gradients that reached it). Bounded mode holds a poll for
// step s until the members that joined by s - staleness pushed that step.
//
// A plain value type owned by a shard's StepMachine (on its loop); its step tracks read it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/byte_codec.h"
#include "common/types.h"

namespace psched {

class Membership {
 public:
  // Every one of `workers` a member from step 1; a step applies while at least `min_workers`
  // (1 .. workers) are members.
  Membership(uint32_t workers, uint32_t min_workers);

  uint32_t workers() const { return static_cast<uint32_t>(joined_.size()); }
  uint32_t min_workers() const { return min_workers_; }
  bool is_member(WorkerId worker) const { return joined_at(worker) != Step(); }
  // The first step `worker` takes part in; Step() when it is no member.
  Step joined_at(WorkerId worker) const {
    return worker.value < joined_.size() ? joined_[worker.value].from : Step();
  }
  // Whether step `step` of a variable waits for `worker`'s gradient (sync) or push (bounded).
  bool expects(WorkerId worker, Step step) const {
    Step from = joined_at(worker);
    return from != Step() && from <= step;
  }
  // Whether `worker` pushed since it joined (a new process with its id must join again).
  bool has_pushed(WorkerId worker) const {
    return is_member(worker) && joined_[worker.value].pushed;
  }
  uint32_t members() const { return members_; }
  // Whether enough workers are members for steps to apply.
  bool quorum() const { return members_ >= min_workers_; }

  // `worker` (below workers()) is a member from step `from` (at least 1), whether it was one
  // or not; its pushes so far are forgotten.
  void join(WorkerId worker, Step from);
  // `worker` is no member any more.
  void leave(WorkerId worker);
  // A member's push was accepted.
  void pushed(WorkerId worker);

  // Everything above, for checkpoints; load() throws Error(corrupt_checkpoint) when what it
  // reads does not fit this membership's workers.
  void save(ByteWriter& out) const;
  void load(ByteReader& in);

 private:
  struct Seat {
    Step from;  // Step(): no member
    bool pushed = false;
  };
  std::vector<Seat> joined_;  // by worker id
  uint32_t min_workers_;
  uint32_t members_;
};

}  // namespace psched
