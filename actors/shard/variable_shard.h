// SPDX-License-Identifier: Apache-2.0
// VariableShard: the server-side actor that owns a set of variables (or this shard's ranges of
// large ones) and their optimizer state, applies received partitions, and answers polls
// through its PollRegistry. Its checkpoints and update log are its ShardDurability's
// (actors/durability/shard_durability.h); what a sync step that waits too long for a worker leads
// to is its SyncTimeouts' (actors/shard/sync_timeouts.h); which workers a sync step waits for
// is its Membership's (actors/shard/membership.h), kept by its Leases and by joins.
//
// The shard lives on one event loop (actors/runtime/actor.h), the one that also owns its listener
// and connections: calls from that loop run at once and reply before they return, except polls,
// which reply when their update is applied. Calls from other threads (the operator view) hop
// onto the loop. Borrowed spans (initial values, gradients) must stay alive until the reply
// runs: the RPC glue passes views into the received message, which lives until it answers.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/durability/shard_durability.h"
#include "actors/runtime/actor.h"
#include "actors/shard/leases.h"
#include "actors/shard/membership.h"
#include "actors/shard/poll_registry.h"
#include "actors/shard/sync_timeouts.h"
#include "actors/shard/variable.h"
#include "common/error.h"
#include "common/histogram.h"
#include "common/policies.h"
#include "common/shard_settings.h"

namespace psched {

// A request a shard failed, kept for operators (VariableShard keeps the newest few).
struct RecentError {
  std::chrono::system_clock::time_point time;
  ErrorCode code;
  std::string message;
};

// A worker as a sync shard sees it (VariableShard::stats).
struct MemberStatus {
  uint32_t worker = 0;
  bool member = false;
  Step joined_at;  // the first step it takes part in (Step(): no member)
  uint32_t connections = 0;
  Step pushed;             // the newest step it pushed here (any variable)
  uint64_t lag_steps = 0;  // steps between the newest any worker pushed here and `pushed`
};

// Counters a shard keeps; read with VariableShard::stats. A copy: reading never touches the
// live counters, which only the shard's loop updates.
struct WireBytes {
  uint64_t raw = 0;
  uint64_t sent = 0;
};

struct ShardStats {
  uint64_t variables = 0;
  uint64_t bytes_received = 0;  // gradient payload bytes accepted
  uint64_t bytes_sent = 0;      // value bytes answered to polls and pulls
  uint64_t partitions_applied = 0;
  uint64_t pushes_rejected = 0;
  uint64_t pushes_duplicate = 0;  // retries of received partitions, acknowledged not applied
  uint64_t checkpoints_written = 0;
  uint64_t sync_timeouts = 0;  // sync steps that waited past sync.timeout_seconds
  uint64_t pushes_late = 0;    // pushes of a step completed without their worker (dropped)
  // Sync membership (actors/shard/membership.h): members now, joins and leaves so far, and
  // element ranges applied from fewer gradients than the job has workers.
  uint64_t members = 0;
  uint64_t joins = 0;
  uint64_t leaves = 0;
  uint64_t short_handed_ranges = 0;
  uint64_t polls_held = 0;  // bounded mode: polls that waited for a member s - staleness behind
  std::vector<MemberStatus> workers;  // sync, bounded: every worker of the job, by id
  uint64_t polls_waiting = 0;
  // Payload bytes on the wire, pushes in and values out, as the variable's dtype carries them
  // (raw) and as they travelled (sent; smaller when compressed, compression/codec.h).
  WireBytes push_wire;
  WireBytes pull_wire;
  Histogram apply_seconds;      // per accepted push: validating and applying (or summing) it
  Histogram poll_wait_seconds;  // per answered poll: from its arrival to its answer
  std::array<uint64_t, kErrorCodeCount> errors{};  // failed requests, indexed by ErrorCode
  std::vector<RecentError> recent_errors;          // the newest kRecentErrors, oldest first
};

// One hosted variable part and its progress; read with VariableShard::variables.
struct VariableStatus {
  std::string name;
  ElementRange part;
  Step step;  // the newest complete step (async: of the furthest worker)
};

// The fresh value of a polled or pulled range, read straight from the variable into where
// the caller wants it (the answer's message): no buffer in between. Valid only during the
// ValueReply call it is passed to, on the shard's loop.
class FreshValue {
 public:
  FreshValue(const Variable& variable, ElementRange range, Step step)
      : variable_(variable), range_(range), step_(step) {}
  // The step whose update the value reflects.
  Step step() const { return step_; }
  Priority priority() const { return variable_.spec().priority; }
  DType dtype() const { return variable_.spec().dtype; }
  uint64_t bytes() const { return range_.size() * element_bytes(variable_.spec().dtype); }
  // Copies the value into `out` (bytes() bytes).
  void read_into(std::byte* out) const { variable_.read(range_, out); }
  // The value in the variable's own memory, which lives as long as the shard and which only
  // the shard's loop changes: an answer may reference it instead of copying it, and then
  // carries the range's value as of when its bytes leave, which includes at least step()'s
  // update (a later update may have landed in between).
  std::span<const std::byte> in_place() const { return variable_.view(range_); }

 private:
  const Variable& variable_;
  ElementRange range_;
  Step step_;
};

class VariableShard : public Actor, private ShardDurability::State, private SyncTimeouts::Actions {
 public:
  static constexpr size_t kRecentErrors = 16;

  // Replies take null, or the refusal (nothing changed).
  using RegisterReply = std::function<void(const Error* refused, VariableId, bool created)>;
  using Receipt = std::function<void(const Error* refused)>;
  // The value of the requested range, or null with the error.
  using ValueReply = std::function<void(const Error* refused, const FreshValue*)>;

  // `apply_pool` (optional) applies large partitions on several threads; it outlives the shard.
  // `device` (optional, outlives the shard) holds the variables and applies their updates
  // instead (a GPU); the apply pool is then unused.
  VariableShard(ActorLoop& loop, ShardSettings settings, ForkJoinPool* apply_pool = nullptr,
                optim::ComputeDevice* device = nullptr);

  // Registers this shard's `part` of a variable with `initial` (part.size() elements).
  // Idempotent for the same spec; a different spec for the name fails with spec_conflict.
  void register_variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                         RegisterReply reply);
  // Applies (async) or accumulates (sync) one partition of `worker`'s step-`step` gradient:
  // `gradient` says whether it is whole or sparse (Variable).
  void push(WorkerId worker, VariableId variable, Step step, ElementRange range, DType dtype,
            std::span<const std::byte> data, PushedGradient gradient, Receipt reply);
  // Answers with the fresh value of `range` once `step`'s update of it is applied.
  // `ticket` (unique per shard) lets the caller withdraw the poll.
  void poll(WorkerId worker, VariableId variable, Step step, ElementRange range, PollTicket ticket,
            ValueReply reply);
  // Forgets a waiting poll unanswered (its caller went away).
  void withdraw_poll(PollTicket ticket);
  // Answers with the current value of `range` at once.
  void pull(VariableId variable, ElementRange range, ValueReply reply);

  // A connection of `worker` opened or closed (its lease, actors/shard/leases.h).
  void connected(WorkerId worker);
  void disconnected(WorkerId worker);
  // The step from which `worker`, a trainer process that starts, takes part. sync: at least
  // `at_least`; a member that has not pushed yet keeps its step (a job's declared workers
  // start at 1), any other (a restarted process of a member, or one whose lease ended) leaves
  // and joins at a step no variable of the shard has begun, so that it is not awaited in
  // steps under way. async: the first step any variable here has not completed for it
  // (`at_least` unused). Refused for a worker id not below the job's workers.
  using JoinReply = std::function<void(const Error* refused, Step from)>;
  void join(WorkerId worker, Step at_least, JoinReply reply);
  // Up to the newest `limit` ranges applied short-handed (ShortHanded), oldest first.
  void short_handed(size_t limit, std::function<void(std::vector<ShortHanded>)> reply);
  void stats(std::function<void(ShardStats)> reply);
  // Answers with the first `limit` hosted variable parts, in registration order.
  void variables(size_t limit, std::function<void(std::vector<VariableStatus>)> reply);
  // Counts an error the RPC layer answered for this shard before the request reached it.
  void report_error(const Error& error);
  // Counts a push's (`push`) or a value's payload, `raw` as its dtype carries it and `sent` as
  // the wire did (the data plane's, server/data_plane.h).
  void count_wire_bytes(bool push, uint64_t raw, uint64_t sent);
  // Fails every waiting poll (the server is stopping), then calls `done` on the loop.
  void shut_down(std::function<void()> done);

  // Sync mode: acts on every step that has waited sync.timeout_seconds or more at `now` for
  // its last worker, as sync.on_timeout says (actors/shard/sync_timeouts.h); bounded mode: on
  // every poll held that long for a member behind; both: ends the membership of workers whose
  // lease ended by `now`. psched-server calls it periodically;
  // tests with a chosen `now`.
  void enforce_deadlines(std::chrono::steady_clock::time_point now);

  static constexpr size_t kShortHandedKept = 1 << 16;

  // Loads the newest valid checkpoint and replays the update logs after it, then writes a
  // fresh checkpoint and starts a new log. Call once, before serving, with a checkpoint
  // directory configured; throws in the reply when none is or a file cannot be written, and
  // (corrupt_checkpoint, naming the file) when a log is damaged or missing, unless
  // settings.accept_log_loss (actors/durability/shard_store.h).
  void restore(std::function<void(std::exception_ptr, RestoreReport)> reply);
  // Takes a checkpoint of everything the shard holds now and starts a new update log; the
  // file is written on a writer thread while pushes go on, then the reply comes
  // with its path. Checkpoints are written in the order taken. Requires a prior restore().
  void checkpoint(std::function<void(std::exception_ptr, std::filesystem::path)> reply);

 private:
  // The variable, or throws unknown_variable naming `what` ("push", "poll", ...).
  Variable& find(const char* what, VariableId id);
  // What variables wait for in sync mode: the membership; null otherwise.
  const Membership* members() const {
    return settings_.mode == Mode::async ? nullptr : &membership_;
  }
  void do_register(VariableSpec& spec, ElementRange part, std::span<const std::byte> initial,
                   const RegisterReply& reply);
  void do_push(WorkerId worker, VariableId id, Step step, ElementRange range, DType dtype,
               std::span<const std::byte> data, PushedGradient gradient);
  // Copies `reply` (the caller's copy can still fail the poll if filing it throws).
  void do_poll(WorkerId worker, VariableId id, Step step, ElementRange range, PollTicket ticket,
               ValueReply& reply);
  void answer(const Variable& variable, ElementRange range, Step step, const ValueReply& reply);
  Step do_join(WorkerId worker, Step at_least);
  // async: the first step some variable here has not completed for `worker`.
  Step resume_step(WorkerId worker) const;
  // bounded: `worker`'s own next step, or level with the slowest other member (skipping the
  // steps it missed), so that it neither holds the others back nor falls behind the bound.
  Step level_step(WorkerId worker) const;
  // The newest step any variable here has begun (sync).
  Step frontier() const;
  // `worker` joins from `from` / leaves, logged first (throws when that fails, changing nothing).
  void join_from(WorkerId worker, Step from);
  void leave(WorkerId worker, std::string_view why);
  // After the membership changed: applies what each variable's step now has and answers polls
  // (sync), or files the held polls that may now wait for their own update only (bounded).
  void settle_all();
  // Bounded: removes the held polls `which` picks and returns them.
  struct HeldPoll;
  std::vector<HeldPoll> take_held(const std::function<bool(const HeldPoll&)>& which);
  // Bounded: files the held polls of `variable` (all: nullopt) whose others reached their step.
  void release_held(std::optional<VariableId> variable);
  // Bounded, with sync.timeout_seconds: a poll held that long is failed with [sync_timeout]
  // naming the members behind (on_timeout: fail) or filed without waiting for them (proceed).
  void time_out_held(std::chrono::steady_clock::time_point now);
  // Files a held poll with the registry, or answers it with the refusal.
  void file_held(const HeldPoll& held);
  // Files a poll with the registry: answered once `worker`'s `step` update of `range` is applied.
  void file_poll(WorkerId worker, VariableId id, Step step, ElementRange range, PollTicket ticket,
                 ValueReply reply);
  // Keeps `variable`'s short-handed records for operators.
  void keep_short_handed(Variable& variable);
  // The joins, leaves and short-handed records so far, in checkpoints: a restarted shard shows
  // the whole job's record, not only what it replayed.
  void save_membership_record(ByteWriter& out) const;
  void load_membership_record(ByteReader& in);
  // Counts a failed request and keeps it among the recent errors. On the loop. Also what
  // sync_timeouts_ counts its timeouts with.
  void count_error(const Error& error) override;
  // SyncTimeouts::Actions, called by sync_timeouts_ on the loop.
  void fail_polls(VariableId id, Step step, const Error& error) override;
  void complete_without_missing(VariableId id, Step step) override;
  // ShardDurability::State, called by durability_ on the loop.
  void save_variables(ByteWriter& out) const override;
  void load_variables(ByteReader& in, uint32_t checkpoint_format) override;
  void replay_register(VariableSpec& spec, ElementRange part,
                       std::span<const std::byte> initial) override;
  void replay_push(WorkerId worker, VariableId id, Step step, ElementRange range, DType dtype,
                   std::span<const std::byte> data, PushedGradient gradient) override;
  void replay_timeout(VariableId id, Step step, const std::string& record) override;
  void replay_join(WorkerId worker, Step from, const std::string& record) override;
  void replay_leave(WorkerId worker, const std::string& record) override;

  ShardSettings settings_;
  ForkJoinPool* apply_pool_;
  optim::ComputeDevice* device_;
  // Loop-owned state:
  PollRegistry polls_;
  std::vector<Variable> variables_;  // index = VariableId
  std::unordered_map<std::string, VariableId> by_name_;
  ShardStats stats_;
  std::deque<RecentError> recent_errors_;  // the newest kRecentErrors
  Membership membership_;                  // sync; its variables point to it
  Leases leases_;
  std::deque<ShortHanded> short_handed_;  // the newest kShortHandedKept
  std::vector<Step> pushed_;              // by worker: the newest step it pushed here
  // Bounded mode: polls held until the other members are close enough (Variable::others_reached).
  struct HeldPoll {
    WorkerId worker;
    VariableId variable;
    Step step;
    ElementRange range;
    PollTicket ticket;
    ValueReply reply;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<HeldPoll> held_;
  ShardDurability durability_;
  SyncTimeouts sync_timeouts_;
};

}  // namespace psched
