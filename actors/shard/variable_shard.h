// SPDX-License-Identifier: Apache-2.0
// VariableShard: the server-side actor that hosts a shard's variables (or its ranges of large
// ones) and its rows of embedding tables, each a HostedKind (actors/shard/hosted_kind.h) that
// only the factory (actors/shard/hosted_kinds.h) makes. It routes each request to the kind its
// id names, lets the kind check what is its own (dtype, range, ids, bytes), hands pushes and
// polls to the shard's StepMachine (actors/shard/step_machine.h), which decides when an update
// applies and a poll may be answered and runs a push's sequence for every kind, and answers
// with a Result (common/result.h): the value, or the refusal, counted in one place. It never
// asks which kind it holds. Sync and bounded steps, membership, leases, held polls and timeouts
// are the machine's; checkpoints and the update log are its ShardDurability's
// (actors/durability/shard_durability.h).
//
// The shard lives on one event loop (actors/runtime/actor.h), the one that also owns its listener
// and connections: calls from that loop run at once and reply before they return, except polls,
// which reply when their update is applied. Calls from other threads (the operator view) hop
// onto the loop. Borrowed spans (initial values, gradients, ids) must stay alive until the reply
// runs: the front ends pass views into the received message, which lives until it answers.
#pragma once

#include <chrono>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actors/durability/shard_durability.h"
#include "actors/runtime/actor.h"
#include "actors/shard/hosted_kind.h"
#include "actors/shard/hosted_kinds.h"
#include "actors/shard/shard_request.h"
#include "actors/shard/shard_stats.h"
#include "actors/shard/step_machine.h"
#include "actors/shard/value_deltas.h"
#include "common/error.h"
#include "common/result.h"
#include "common/shard_settings.h"

namespace psched {

// The answer to a poll or a pull, read straight from its kind into where the caller wants it
// (the answer's message): no buffer in between. Valid only during the ValueReply call it is
// passed to, on the shard's loop.
class FreshValue {
 public:
  // `borrow`: whether in_place() may hand out the kind's memory (not a serving shard's, whose
  // versions are freed at a reload while an answer may still reference them).
  FreshValue(const HostedKind& kind, const Poll& poll, Step step, bool borrow = true)
      : kind_(kind), poll_(poll), step_(step), borrow_(borrow) {}
  // The step whose update the value reflects (at least).
  Step step() const { return step_; }
  Priority priority() const { return kind_.priority(); }
  DType dtype() const { return kind_.dtype(); }
  uint64_t bytes() const { return kind_.answer_bytes(poll_); }
  // Copies the value into `out` (bytes() bytes): a range's elements, or the rows one after
  // another in the poll's order.
  void read_into(std::span<std::byte> out) const { kind_.read(poll_, out); }
  // The value in the kind's own memory, which lives as long as the shard and which only the
  // shard's loop changes: an answer may reference it instead of copying it, and then carries
  // the value as of when its bytes leave, which includes at least step()'s update (a later
  // update may have landed in between). Empty where the kind keeps no such piece (rows):
  // read_into() then.
  std::span<const std::byte> in_place() const {
    return borrow_ ? kind_.view(poll_) : std::span<const std::byte>();
  }

 private:
  const HostedKind& kind_;
  Poll poll_;
  Step step_;
  bool borrow_;
};

class VariableShard : public Actor, private ShardDurability::State, private StepMachine::Host {
 public:
  static constexpr size_t kRecentErrors = 16;
  static constexpr size_t kShortHandedKept = StepMachine::kShortHandedKept;

  struct Registration {
    VariableId id;
    bool created = false;  // false: the same spec was registered before (a no-op)
  };
  // Each reply runs once, with the answer or the refusal (which changed nothing).
  using RegisterReply = std::function<void(const Result<Registration>&)>;
  using Receipt = std::function<void(const Result<>&)>;
  using ValueReply = std::function<void(const Result<FreshValue>&)>;
  using JoinReply = std::function<void(const Result<Step>&)>;

  // `apply_pool` (optional) applies large partitions on several threads; it outlives the shard.
  // `device` (optional, outlives the shard) holds the variables and applies their updates
  // instead (a GPU); the apply pool is then unused.
  VariableShard(ActorLoop& loop, ShardSettings settings, ForkJoinPool* apply_pool = nullptr,
                optim::ComputeDevice* device = nullptr);
  // On the loop; waits for a reload's load beside (reload()) to end.
  ~VariableShard();

  // Registers this shard's `part` of a variable with `initial` (part.size() elements).
  // Idempotent for the same spec; a different spec for the name fails with spec_conflict.
  void register_variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                         RegisterReply reply);
  // Applies (async, bounded) or gathers (sync) a worker's push: one partition of a variable's
  // gradient, or its step of a table's rows held here (all or nothing: bad ids or widths
  // refuse the whole push). `reply` is its receipt.
  void push(Push push, Receipt reply);
  // Answers with the poll's fresh value (a variable's range, a table's rows) once its step's
  // update of it is applied.
  void poll(Poll poll, ValueReply reply);
  // push(), then poll() of the same range in the same call: `receipt` runs with the push's
  // outcome, then `reply` with the value, only when the push was taken.
  void push_poll(Push push, PollTicket ticket, Receipt receipt, ValueReply reply);
  // Forgets a waiting poll unanswered (its caller went away).
  void withdraw_poll(PollTicket ticket);
  // Answers with the current value of `range` at once.
  void pull(VariableId variable, ElementRange range, ValueReply reply);

  // Registers this shard's rows of embedding table `spec` (actors/shard/row_table.h; every
  // shard holds the rows placement gives it), in the same id space as variables, after the
  // deployment's entry for it (tables:) filled in what the registration leaves out. The same
  // spec again is a no-op; another for the name fails with spec_conflict. A table's pushes and
  // polls are push() and poll() with its rows' ids.
  void register_table(TableSpec spec, RegisterReply reply);

  // A connection of `worker` opened or closed (its lease, actors/shard/leases.h).
  void connected(WorkerId worker);
  void disconnected(WorkerId worker);
  // The step from which `worker`, a trainer process that starts, takes part
  // (StepMachine::join).
  void join(WorkerId worker, Step at_least, JoinReply reply);
  // Acts on what is overdue at `now` (StepMachine::enforce): psched-server calls it
  // periodically, tests with a chosen `now`.
  void enforce_deadlines(std::chrono::steady_clock::time_point now);

  // Up to the newest `limit` ranges applied short-handed, oldest first.
  void short_handed(size_t limit, std::function<void(std::vector<ShortHanded>)> reply);
  void stats(std::function<void(ShardStats)> reply);
  // Answers with the first `limit` hosted variable parts, in registration order.
  void variables(size_t limit, std::function<void(std::vector<VariableStatus>)> reply);
  // Counts an error a front end answered for this shard before the request reached it.
  void report_error(const Error& error);
  // Counts a push's (`push`) or a value's payload, `raw` as its dtype carries it and `sent` as
  // the wire did (the data plane's, server/data_plane.h).
  void count_wire_bytes(bool push, uint64_t raw, uint64_t sent);
  // Answers a delta poll (`pull: topk`) of `variable`'s `range`, whose current values are
  // `current` (ValueDeltas::answer), and counts it; full values when it hosts no such variable.
  // Called directly, on the shard's loop (by the data plane, as the answer leaves).
  DeltaReply answer_delta(VariableId variable, ElementRange range,
                          std::span<const std::byte> current, const DeltaAsk& ask,
                          std::vector<std::byte>& body);
  // Fails every waiting poll (the server is stopping), then calls `done` on the loop.
  void shut_down(std::function<void()> done);

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

  // A serving shard (settings.serve_directory; psched-server --serve): loads `first`, this
  // shard's newest valid checkpoint in that directory (ShardDurability::newest_served, which
  // ShardHost reads once for the job's mode and workers), read-only
  // (ShardDurability::load_served: no log replayed, nothing written). From then on it answers polls
  // and pulls at once with the values it holds, refuses every push with Error(read_only) naming the
  // variable or table and the version served, and a registration of what it does not hold the same
  // way (one of what it holds, with the same spec, is the usual no-op: inference clients register
  // as trainers do). It never checkpoints. Call once instead of restore(), before serving; the
  // reply has the version, or the refusal (bad_config, corrupt_checkpoint: naming the directory or
  // file).
  void serve(ShardStore::Checkpoint first,
             std::function<void(std::exception_ptr, ServedVersion)> reply);
  // A serving shard: loads the newest checkpoint of the served directory beside the version it
  // serves (on a thread of its own, while this one goes on answering), then takes it in one
  // turn of the loop under the same ids (new variables and tables after them) and frees the
  // old one off the loop. The reply has the new version; nullopt when there is no newer
  // checkpoint (nothing changes). A version that cannot take the served one's place is refused
  // (bad_config: another job or slot map, something served missing; spec_conflict: a spec
  // changed; corrupt_checkpoint: trained with another worker count), counted in
  // reloads_refused, and the served one goes on; so is a reload asked for while one is under way
  // (overloaded), one of a shard that serves nothing (bad_config) and one whose loader thread
  // cannot start. Delta polls (pull: topk) of a serving shard are answered in full.
  using ReloadReply = std::function<void(std::exception_ptr, std::optional<ServedVersion>)>;
  void reload(ReloadReply reply);

  // The job it serves and the job's slot map (common/slot_map.h): what workers place rows and
  // variables by (ClusterLayout). Kept in its checkpoints. On the loop.
  uint64_t job() const { return durability_.job(); }
  const SlotMap& slot_map() const { return durability_.slot_map(); }

 private:
  using Clock = std::chrono::steady_clock;

  // `result` (psched::attempt's), its refusal counted: the one place the shard counts the
  // requests it refuses.
  template <typename T>
  Result<T> counted(Result<T> result) {
    if (!result) count_error(result.error());
    return result;
  }
  // The kind `id` names, or throws unknown_variable naming `what` ("push", "poll", ...).
  HostedKind& find(const char* what, VariableId id);
  // Hosts what `enrollment` asks for (a no-op when it is hosted already): checked, logged, made.
  Registration enroll(Enrollment& enrollment);
  // A new id for `kind`, tracked by the step machine over its extent.
  VariableId add(std::unique_ptr<HostedKind> kind);
  // Takes `push`, checked by its kind, through the step machine (sync may hold it for the step
  // before); `reply` gets its receipt, counted and timed, or its refusal.
  void take_push(const Push& push, const Receipt& reply);
  // Throws [overloaded] naming the kind and limits.max_table_bytes when storing what `push`
  // adds would take the shard's stored rows past it.
  void check_stored_bytes(const HostedKind& kind, const Push& push) const;
  // Files `poll` with the step machine; `reply` gets the value once it is ready, or the
  // refusal.
  void file_poll(const Poll& poll, const ValueReply& reply);
  void answer(VariableId id, const Poll& poll, Step step, const ValueReply& reply);
  // Throws Error(read_only) naming `what` ("push to table 'emb'") when the shard serves.
  void refuse_if_serving(const std::string& what) const;
  // Loads the newest checkpoint of the served directory into this shard, which holds nothing,
  // unless its generation is not above `newer_than`: the version, its step found. Off the loop
  // while nothing else uses this shard (reload's load beside), or on it.
  std::optional<ServedVersion> load_version(uint64_t newer_than);
  // Loads `found` into this shard, which holds nothing: the version, its step found.
  ServedVersion load_found(const ShardStore::Checkpoint& found);
  // The loader thread's work: loads the version newer than `newer_than` into `next` (which
  // nothing else touches meanwhile), at SCHED_IDLE, then posts the outcome to the loop.
  void load_beside(std::shared_ptr<VariableShard> next, uint64_t newer_than,
                   std::shared_ptr<bool> alive, ReloadReply reply);
  // A reload's load beside is over (on the loop): `next` holds `version` (nullopt: none newer),
  // or `error` says why not. Takes it, then replies.
  void loaded(VariableShard& next, std::optional<ServedVersion> version, std::exception_ptr error,
              const ReloadReply& reply);
  // Takes `next`'s kinds (a version load_version loaded) in place of the served ones, all or
  // nothing (reload says what is refused), and hands the old ones to a thread that frees them.
  void take_version(VariableShard& next, const ServedVersion& version);
  // Frees `kinds` on a thread of its own (at SCHED_IDLE, detached), off the loop.
  void release(std::vector<std::unique_ptr<HostedKind>> kinds);

  // StepMachine::Host, called by steps_ on the loop.
  void apply_gathered(VariableId id, const StepUpdate& update) override;
  void log_push(const Push& push) override { durability_.log_push(push); }
  void log_join(WorkerId worker, Step from) override { durability_.log_join(worker, from); }
  void log_leave(WorkerId worker) override { durability_.log_leave(worker); }
  void log_timeout(VariableId id, Step step) override { durability_.log_timeout(id, step); }
  void count_error(const Error& error) override;
  // ShardDurability::State, called by durability_ on the loop (variable_shard_state.cc).
  void save_variables(ByteWriter& out) const override;
  uint64_t freeze_rows(ShardDurability::RowsEmit emit) override;
  bool save_rows() override;
  void load_variables(ByteReader& in, ByteSource& rows) override;
  void replay_register(VariableSpec& spec, ElementRange part,
                       std::span<const std::byte> initial) override;
  void replay_register_table(TableSpec& spec) override;
  // A logged push, taken at once (the log holds pushes in the order they were taken): throws
  // its refusal.
  void replay_push(const Push& push) override;
  void replay_timeout(VariableId id, Step step, const std::string& record) override {
    steps_.replay_timeout(id, step, record);
  }
  void replay_join(WorkerId worker, Step from, const std::string& record) override {
    steps_.replay_join(worker, from, record, Clock::now());
  }
  void replay_leave(WorkerId worker, const std::string& record) override {
    steps_.replay_leave(worker, record, Clock::now());
  }

  ShardSettings settings_;
  ForkJoinPool* apply_pool_;
  optim::ComputeDevice* device_;
  // Loop-owned state:
  std::vector<std::unique_ptr<HostedKind>> hosted_;  // index = VariableId
  size_t saving_ = 0;  // the first kind a checkpoint's stream may still have units of
  std::unordered_map<std::string, VariableId> by_name_;
  ShardStats stats_;                       // what the kinds and the step machine do not keep
  std::deque<RecentError> recent_errors_;  // the newest kRecentErrors
  StepMachine steps_;
  ShardDurability durability_;
  // A serving shard's (serve()): the version served, whether a reload's load is under way and
  // the thread loading it beside (joined when the next starts, or by the destructor); expires
  // with the shard, for the load's outcome posted back to the loop.
  std::optional<ServedVersion> served_;
  bool loading_ = false;
  std::thread loader_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace psched
