// SPDX-License-Identifier: Apache-2.0
// StepMachine: the one unit on a shard that decides when a step is done, for every kind of
// variable it hosts. It knows the job's members (actors/shard/membership.h) and their leases
// (actors/shard/leases.h), where each variable's steps stand and who pushed what
// (actors/shard/step_track.h), when a sync step closes, when a poll may be answered (async:
// the worker's own update; sync: every member's; bounded: also every member s - staleness
// behind), which polls wait or are held and when a wait times out (sync.timeout_seconds), and
// what of all that a checkpoint keeps. A kind of variable (a dense Variable) keeps only its
// values, optimizer state and sums, and carries out the StepUpdates the machine hands it.
//
// The rules, mode by mode:
// - async: each push is applied on arrival; a worker's poll waits for its own update.
// - sync: a variable's step s applies the mean of its members' gradients, each element range as
//   soon as every member step s waits for pushed it. Members hold leases; a member whose lease
//   ended leaves, and a step that waited for it applies what the others gave. A worker joins
//   at a step no variable here has begun. A step waiting sync.timeout_seconds for its last
//   member fails its polls or, on_timeout: proceed, closes without the missing ones (their late
//   pushes of it are acknowledged and dropped). A poll for the step after the one under way (a
//   prefetch of the next step's rows, sent before this step closes) is held until this one
//   completes, then waits as any other; so is a push of that step (a worker whose rows of
//   this step came early, from other shards or a stale prefetch, is on to the next one), which
//   is taken, and answered, once this one completes. A worker that sends a step's push to a
//   shard only after that shard took its previous one is never further ahead than that.
// - bounded: applied as async, but a poll for step s is held until every member pushed step
//   s - staleness; a poll held sync.timeout_seconds fails naming who is behind, or (proceed)
//   waits for its own update only. A worker that joins starts level with the slowest member.
//
// The rule is each variable's (StepRule, given to add()): the job's mode for its dense
// variables, and for a table its own where the deployment gives one (hybrid: dense sync beside
// bounded or async tables), never stricter than the job's mode. Membership, leases and joins
// are the job's (its mode); what waits, is held or times out follows each variable's rule.
//
// Owner and threads: each VariableShard owns one and calls it directly on the shard's loop, the
// only thread that touches it. Time comes in as an argument, so tests choose it: the machine
// reads no clock. What the machine needs done to the shard (a kind applying gathered sums, an
// update or a membership change logged) it asks of its Host, on the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/runtime/actor.h"
#include "actors/shard/hosted_kind.h"
#include "actors/shard/leases.h"
#include "actors/shard/membership.h"
#include "actors/shard/poll_registry.h"
#include "actors/shard/shard_request.h"
#include "actors/shard/shard_stats.h"
#include "actors/shard/step_track.h"
#include "common/byte_codec.h"
#include "common/shard_settings.h"

namespace psched {

class StepMachine {
 public:
  using Clock = std::chrono::steady_clock;
  // A poll's answer: ok once the update it waits for is applied, else why it never will be.
  using Answer = PollRegistry::Answer;

  static constexpr size_t kShortHandedKept = 1 << 16;

  // What the machine asks of its shard, on the loop.
  class Host {
   public:
    // The kind of variable `id` applies the means gathered for `update`'s complete pieces (a
    // membership change or a timeout completed them; Variable::apply_gathered).
    virtual void apply_gathered(VariableId id, const StepUpdate& update) = 0;
    // Logged before the change is made; each throws when it cannot be (nothing changes then).
    virtual void log_push(const Push& push) = 0;
    virtual void log_join(WorkerId worker, Step from) = 0;
    virtual void log_leave(WorkerId worker) = 0;
    virtual void log_timeout(VariableId id, Step step) = 0;
    // Counts an event among the shard's failed requests: a timeout, a change that could not be
    // logged.
    virtual void count_error(const Error& error) = 0;

   protected:
    ~Host() = default;
  };

  // `settings` and `host` (the owning shard's) outlive the machine.
  StepMachine(ActorLoop& loop, const ShardSettings& settings, Host& host);

  // Tracks the steps of the next variable (its id is the count so far): `name` for messages,
  // `extent` the part a step covers, `rule` how its steps wait. Throws Error(bad_config) for a
  // rule stricter than the job's mode.
  void add(std::string name, ElementRange extent, StepRule rule);
  size_t variables() const { return tracks_.size(); }
  const StepTrack& track(VariableId id) const { return tracks_[id.value]; }

  // Takes `push` of `kind`, the variable `push.variable` names, covering `units` of it (the
  // kind's check_push passed): admits it, which throws unless the worker may push those units
  // of that step (StepTrack::is_duplicate); for a fresh one, has the host log it, receives it
  // and has the kind carry out the StepUpdate; then answers the polls the update completed and
  // keeps what follows from the push (the member's progress, bounded mode's held polls, the
  // sync step's timing). Returns what it was.
  enum class Admission {
    fresh,
    duplicate,  // a resent partition: acknowledged, not applied again
    late,       // a push of a step that closed without its worker (proceed): dropped, counted
  };
  // What became of a push take() was given, once: its admission, or why it was refused; `held`
  // when it waited for the step before it (sync).
  using Taken = std::function<void(const Result<Admission>& admission, bool held)>;
  void take(HostedKind& kind, const Push& push, ElementRange units, Clock::time_point now,
            Taken taken);

  // Calls `answer` once the poll's worker's step update of its range is applied (at once when
  // it is), bounded mode holding it until the members behind caught up, sync mode one for the
  // step after the one under way until that one completes; its ticket (unique per shard) lets
  // the caller withdraw it. Throws step_from_future for a step beyond those.
  void poll(const Poll& poll, Answer answer, Clock::time_point now);
  // Forgets the poll with `ticket` unanswered; nothing when it was answered already.
  void withdraw(PollTicket ticket);
  // Fails every waiting and held poll, and every held push, with `error` (the shard is
  // stopping).
  void fail_all(const Error& error);

  // The step from which `worker`, a trainer process that starts, takes part. sync: at least
  // `at_least`; a member that has not pushed yet keeps its step (a job's declared workers
  // start at 1), any other (a restarted process of a member, or one whose lease ended) leaves
  // and joins at a step no variable here has begun, so that it is not awaited in steps under
  // way. bounded: level with the slowest other member. async: the first step some variable here
  // has not completed for it, Step() when the shard hosts none (the job's placement may leave a
  // shard without a dense variable: it has no say). Throws for a worker id not below the job's
  // workers.
  Step join(WorkerId worker, Step at_least, Clock::time_point now);
  // A connection of `worker` opened or closed (its lease).
  void connected(WorkerId worker);
  void disconnected(WorkerId worker, Clock::time_point now);
  // Acts on what is overdue at `now`: sync steps and bounded held polls that waited
  // sync.timeout_seconds for members behind, and members whose lease ended.
  void enforce(Clock::time_point now);
  // A restored job under way resumes: the lease of every worker without a connection runs from
  // `now`. Nothing when no step has begun.
  void resumed(Clock::time_point now);

  // Fills in what the machine counts: members and their lag, polls waiting and held, pushes
  // held, timeouts, late pushes, joins, leaves, ranges applied (and short-handed).
  void report(ShardStats& stats) const;
  // Up to the newest `limit` ranges applied short-handed, oldest first.
  std::vector<ShortHanded> short_handed(size_t limit) const;

  // What a checkpoint keeps: the membership and its record (joins, leaves, ranges applied
  // short-handed), so that a restarted shard shows the whole job's record; and each track's
  // progress (StepTrack::save, within its variable's record).
  void save(ByteWriter& out) const;
  void load(ByteReader& in);
  // Reads past a record save() wrote for a job of `workers` workers (psched reshard, which
  // copies it), checking it as load() does; its membership's record is the first bytes read.
  static void skip_saved(ByteReader& in, uint32_t workers);
  void load_track(VariableId id, ByteReader& in);
  // An update log's records of the machine's own decisions, made again; `record` names the
  // record in errors (corrupt_checkpoint when it cannot have been written).
  void replay_timeout(VariableId id, Step step, const std::string& record);
  void replay_join(WorkerId worker, Step from, const std::string& record, Clock::time_point now);
  void replay_leave(WorkerId worker, const std::string& record, Clock::time_point now);

 private:
  // A poll the machine keeps: bounded mode's held until the members behind caught up, sync
  // mode's held until the step before its own completes.
  struct HeldPoll {
    Poll poll;
    Answer answer;
    Clock::time_point since;
  };

  // A push the machine keeps until the step before its own completes (sync). Its kind outlives
  // it (the shard's); what `push` borrows lives until `taken` has run.
  struct HeldPush {
    HostedKind* kind;
    Push push;
    ElementRange units;
    Taken taken;
  };
  // take() without holding: whether the push is fresh, and for a fresh one its update carried
  // out. Throws what the track refuses.
  Admission take_now(HostedKind& kind, const Push& push, ElementRange units, Clock::time_point now);
  // sync: whether `push` is of the step after the one under way, to be held.
  bool holds(const Push& push) const;
  // Takes the held pushes of `id` whose step is the one under way now, in arrival order.
  void release_pushes(VariableId id, Clock::time_point now);
  // Answers the held pushes `which` picks with `error`.
  void fail_pushes(const std::function<bool(const HeldPush&)>& which, const Error& error);
  // take_now()'s steps: whether the push is fresh, then what the update it was completed.
  Admission admit(WorkerId worker, VariableId id, Step step, ElementRange range);
  void applied(WorkerId worker, VariableId id, const StepUpdate& update, Clock::time_point now);
  // Whether the job has members (sync, bounded).
  bool has_members() const { return settings_.mode != Mode::async; }
  // Variable `id`'s mode and staleness.
  Mode mode_of(VariableId id) const { return tracks_[id.value].mode(); }
  uint64_t staleness_of(VariableId id) const { return staleness_[id.value]; }
  // Answers the polls that `update` of `id` (owner `owner`) completed.
  void answer_polls(VariableId id, WorkerId owner, const StepUpdate& update);
  // Whether `poll` is held before it is filed, its checks made first (a bad one throws).
  bool holds(const Poll& poll) const;
  // Whether a held `poll` must stay held (bounded: members behind; sync: the step before its
  // own not complete).
  bool still_held(const Poll& poll) const;
  // Files a poll with the registry: answered once its worker's step update of its range applied.
  void file(const HeldPoll& held);
  // Files a held poll, or answers it with the refusal.
  void file_held(const HeldPoll& held);
  // Files the held polls of `variable` (all: nullopt) that no longer wait (still_held).
  void release_held(std::optional<VariableId> variable);
  // Removes the held polls `which` picks and returns them.
  std::vector<HeldPoll> take_held(const std::function<bool(const HeldPoll&)>& which);

  // async: the first step some variable here has not completed for `worker`; Step() for none.
  Step resume_step(WorkerId worker) const;
  // bounded: `worker`'s own next step, or level with the slowest other member (skipping the
  // steps it missed), so that it neither holds the others back nor falls behind the bound.
  Step level_step(WorkerId worker) const;
  // The newest step any variable here has begun (sync).
  Step frontier() const;
  // `worker` joins from `from` / leaves, logged first (throws when that fails, changing nothing).
  void join_from(WorkerId worker, Step from, Clock::time_point now);
  void leave(WorkerId worker, std::string_view why, Clock::time_point now);
  // After the membership changed: applies what each variable's step now has and answers polls
  // (sync), or files the held polls that may now wait for their own update only (bounded).
  void settle_all(Clock::time_point now);
  // Members whose lease ended by `now` leave.
  void end_leases(Clock::time_point now);

  // sync: times `id`'s step in progress from its first push; forgets it once complete.
  void time_step(VariableId id, Clock::time_point now);
  // The [sync_timeout] that ends a wait for members behind: counted and logged.
  Error timed_out(const std::string& message);
  // sync: acts on each step overdue at `now` (time_out_step); bounded: on each held poll
  // overdue.
  void time_out_steps(Clock::time_point now);
  void time_out_step(VariableId id, Clock::time_point now);
  void time_out_held(Clock::time_point now);
  // sync, proceed: closes step `step` of `id` without its missing members.
  void close_without_missing(VariableId id, Step step);

  // Keeps `track`'s short-handed records for operators.
  void keep_short_handed(StepTrack& track);
  bool proceeds() const { return settings_.steps.on_timeout == TimeoutAction::proceed; }

  const ShardSettings& settings_;
  Host& host_;
  Membership members_;  // sync, bounded; the tracks point to it
  Leases leases_;
  std::vector<StepTrack> tracks_;  // index = VariableId
  std::vector<uint64_t>
      staleness_;  // index = VariableId: bounded, its rule's; its mode: the track's
  PollRegistry polls_;
  std::vector<HeldPoll> held_;  // bounded: members behind; sync: the step before not complete
  std::vector<HeldPush> held_pushes_;  // sync: the step before not complete
  std::vector<Step> pushed_;           // by worker: the newest step it pushed here
  // sync: when each variable's step in progress began (its first push), and the last step
  // each closed without some members, with those members.
  std::unordered_map<uint32_t, Clock::time_point> step_began_;
  std::unordered_map<uint32_t, std::pair<Step, std::vector<uint32_t>>> closed_without_;
  std::deque<ShortHanded> short_handed_;  // the newest kShortHandedKept
  uint64_t short_handed_ranges_ = 0;
  uint64_t joins_ = 0;
  uint64_t leaves_ = 0;
  uint64_t timeouts_ = 0;
  uint64_t late_pushes_ = 0;
  uint64_t polls_held_ = 0;
  uint64_t pushes_held_ = 0;
  uint64_t pieces_applied_ = 0;
};

}  // namespace psched
