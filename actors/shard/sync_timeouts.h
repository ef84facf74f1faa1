// SPDX-License-Identifier: Apache-2.0
// SyncTimeouts: a sync-mode shard's liveness policy (`sync:`, config/deployment.h). It times
// each variable's step in progress from the push that began it, and acts on a step that has
// waited sync.timeout_seconds for its last worker as sync.on_timeout says: `fail` fails the
// polls waiting for the step with [sync_timeout] naming the missing workers, then times it
// afresh; `proceed` has the shard complete the step without them, whose late pushes of it are
// then dropped. It counts both.
//
// Owner and threads: each VariableShard owns one and calls it directly on the shard's loop, the
// only thread that touches it; it acts on the shard's polls and variables through the shard's
// Actions, also on the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/shard/variable.h"
#include "common/shard_settings.h"
#include "common/types.h"

namespace psched {

class SyncTimeouts {
 public:
  using Clock = std::chrono::steady_clock;

  // What the policy does to the shard, called on its loop.
  class Actions {
   public:
    // Counts `error` (a [sync_timeout]) among the shard's failed requests.
    virtual void count_error(const Error& error) = 0;
    // Fails the polls waiting for step `step` of variable `id` with `error`.
    virtual void fail_polls(VariableId id, Step step, const Error& error) = 0;
    // Completes step `step` of `id` without its missing workers (logged first, like any
    // accepted update; throws when it cannot be) and answers the polls waiting for it.
    virtual void complete_without_missing(VariableId id, Step step) = 0;

   protected:
    ~Actions() = default;
  };

  // `settings` and `actions` (the owning shard's) outlive this.
  SyncTimeouts(const ShardSettings& settings, Actions& actions);

  // After an accepted push to `variable` at `now` (sync mode): times its step in progress from
  // its first push, and forgets it once the step is complete.
  void pushed(VariableId id, const Variable& variable, Clock::time_point now);
  // A duplicate push of `step` from `worker`: whether it is a late one of a step completed
  // without that worker; counts it when it is.
  bool late_push(VariableId id, WorkerId worker, Step step);
  // Acts on every step that has waited sync.timeout_seconds or more at `now`; `variables` are
  // the shard's, indexed by VariableId. Does nothing unless the shard is in sync mode with a
  // timeout.
  void enforce(Clock::time_point now, const std::vector<Variable>& variables);

  uint64_t timeouts() const { return timeouts_; }        // steps that waited past the timeout
  uint64_t late_pushes() const { return late_pushes_; }  // late pushes, acknowledged, dropped

 private:
  void time_out(VariableId id, const Variable& variable, Clock::time_point now);

  const ShardSettings& settings_;
  Actions& actions_;
  // When the step in progress of each variable began (its first push).
  std::unordered_map<uint32_t, Clock::time_point> step_began_;
  // Per variable, the last step completed without some workers, and those workers.
  std::unordered_map<uint32_t, std::pair<Step, std::vector<uint32_t>>> completed_without_;
  uint64_t timeouts_ = 0;
  uint64_t late_pushes_ = 0;
};

}  // namespace psched
