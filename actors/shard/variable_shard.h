// SPDX-License-Identifier: Apache-2.0
// VariableShard: the server-side actor that hosts a shard's variables (or its ranges of large
// ones). It routes each request to the variable's kind and to the shard's StepMachine and
// replies: it finds the variable, lets the kind check what is its own (dtype, range, bytes),
// asks the StepMachine (actors/shard/step_machine.h) whether and when the update applies and
// when a poll may be answered, has the kind carry out the machine's StepUpdates, and answers
// with a Result (common/result.h): the value, or the refusal, counted in one place. Sync and
// bounded steps, membership, leases, held polls and timeouts are the machine's; checkpoints and
// the update log are its ShardDurability's (actors/durability/shard_durability.h).
//
// The shard lives on one event loop (actors/runtime/actor.h), the one that also owns its listener
// and connections: calls from that loop run at once and reply before they return, except polls,
// which reply when their update is applied. Calls from other threads (the operator view) hop
// onto the loop. Borrowed spans (initial values, gradients) must stay alive until the reply
// runs: the front ends pass views into the received message, which lives until it answers.
#pragma once

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
#include "actors/shard/row_table.h"
#include "actors/shard/shard_request.h"
#include "actors/shard/shard_stats.h"
#include "actors/shard/step_machine.h"
#include "actors/shard/variable.h"
#include "common/error.h"
#include "common/result.h"
#include "common/shard_settings.h"

namespace psched {

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

// The rows a pull asked for, read from the table into where the caller wants them. Valid only
// during the RowsReply call it is passed to, on the shard's loop.
class FreshRows {
 public:
  FreshRows(const RowTable& table, std::span<const uint64_t> ids, Step step)
      : table_(table), ids_(ids), step_(step) {}
  // The step whose update of the rows they reflect (at least).
  Step step() const { return step_; }
  Priority priority() const { return table_.spec().priority; }
  DType dtype() const { return table_.spec().dtype; }
  uint64_t bytes() const { return ids_.size() * table_.spec().row_bytes(); }
  // Copies the rows into `out` (bytes() bytes), one after another in the pull's order.
  void read_into(std::span<std::byte> out) const { table_.read(ids_, out); }

 private:
  const RowTable& table_;
  std::span<const uint64_t> ids_;
  Step step_;
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
  using RowsReply = std::function<void(const Result<FreshRows>&)>;

  // `apply_pool` (optional) applies large partitions on several threads; it outlives the shard.
  // `device` (optional, outlives the shard) holds the variables and applies their updates
  // instead (a GPU); the apply pool is then unused.
  VariableShard(ActorLoop& loop, ShardSettings settings, ForkJoinPool* apply_pool = nullptr,
                optim::ComputeDevice* device = nullptr);

  // Registers this shard's `part` of a variable with `initial` (part.size() elements).
  // Idempotent for the same spec; a different spec for the name fails with spec_conflict.
  void register_variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                         RegisterReply reply);
  // Applies (async, bounded) or gathers (sync) one partition of a worker's gradient; `reply`
  // is its receipt.
  void push(Push push, Receipt reply);
  // Answers with the fresh value of the poll's range once its step's update of it is applied.
  void poll(Poll poll, ValueReply reply);
  // push(), then poll() of the same range in the same call: `receipt` runs with the push's
  // outcome, then `reply` with the value, only when the push was taken.
  void push_poll(Push push, PollTicket ticket, Receipt receipt, ValueReply reply);
  // Forgets a waiting poll unanswered (its caller went away).
  void withdraw_poll(PollTicket ticket);
  // Answers with the current value of `range` at once.
  void pull(VariableId variable, ElementRange range, ValueReply reply);

  // Embedding tables (actors/shard/row_table.h), in the same id space as variables and stepped
  // by the same StepMachine: a table's step on this shard is a range of its parts.
  //
  // Registers this shard's rows of table `spec` (every shard holds the rows placement gives
  // it). The same spec again is a no-op; another for the name fails with spec_conflict.
  void register_table(TableSpec spec, RegisterReply reply);
  // Applies (async, bounded) or gathers (sync) a worker's step of the table's rows held here:
  // every part of it, at once; all or nothing (bad ids, widths, a step out of turn refuse the
  // whole push). `reply` is its receipt.
  void push_rows(RowPush push, Receipt reply);
  // Answers with the pull's rows once its step's update of their parts is applied.
  void pull_rows(RowPull pull, RowsReply reply);

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

 private:
  using Clock = std::chrono::steady_clock;

  // `result` (psched::attempt's), its refusal counted: the one place the shard counts the
  // requests it refuses.
  template <typename T>
  Result<T> counted(Result<T> result) {
    if (!result) count_error(result.error());
    return result;
  }
  // What an id of the shard's names: a dense variable or a table, by its index among its kind.
  struct Hosted {
    enum class Kind : uint8_t { variable, table } kind;
    uint32_t index;
  };
  // The variable, or throws unknown_variable naming `what` ("push", "poll", ...).
  Variable& find(const char* what, VariableId id);
  // The table, or throws unknown_variable naming `what`.
  RowTable& find_table(const char* what, VariableId id);
  // The name's id, or nullopt; throws spec_conflict when it names the other kind.
  std::optional<VariableId> registered(const std::string& name, Hosted::Kind kind) const;
  // A new id for `name` of `kind`, tracked by the step machine over `extent`.
  VariableId add_hosted(const std::string& name, Hosted::Kind kind, ElementRange extent);
  Registration do_register(VariableSpec& spec, ElementRange part,
                           std::span<const std::byte> initial);
  // A push's receipt (`apply`, a dense push's or a table's rows'): taken, timed and counted,
  // or refused.
  Result<> take_push(const std::function<void()>& apply);
  void do_push(const Push& push);
  // Files `poll` with the step machine; `reply` gets the value once it is ready, or the
  // refusal.
  void file_poll(const Poll& poll, const ValueReply& reply);
  void answer(const Variable& variable, ElementRange range, Step step, const ValueReply& reply);
  Registration do_register_table(TableSpec& spec);
  void do_push_rows(const RowPush& push);
  void file_pull_rows(const RowPull& pull, const RowsReply& reply);
  // Throws [overloaded] naming the table and limits.max_table_bytes when storing the rows of
  // `ids` not stored yet would take the shard's tables past it.
  void check_table_bytes(const RowTable& table, std::span<const uint64_t> ids) const;
  // The shard's hosted ids, each kind's record (variable_shard_state.cc).
  void save_hosted(ByteWriter& out, VariableId id) const;
  void load_hosted(ByteReader& in, Hosted::Kind kind, uint32_t checkpoint_format, ByteSource& rows);
  // Each table's figures into `stats`.
  void report_tables(ShardStats& stats) const;

  // StepMachine::Host, called by steps_ on the loop.
  void apply_gathered(VariableId id, const StepUpdate& update) override;
  void log_join(WorkerId worker, Step from) override { durability_.log_join(worker, from); }
  void log_leave(WorkerId worker) override { durability_.log_leave(worker); }
  void log_timeout(VariableId id, Step step) override { durability_.log_timeout(id, step); }
  void count_error(const Error& error) override;
  // ShardDurability::State, called by durability_ on the loop.
  void save_variables(ByteWriter& out) const override;
  uint64_t freeze_rows(ShardDurability::RowsEmit emit) override;
  bool save_rows() override;
  void load_variables(ByteReader& in, uint32_t checkpoint_format, ByteSource& rows) override;
  void replay_register(VariableSpec& spec, ElementRange part,
                       std::span<const std::byte> initial) override;
  void replay_push(WorkerId worker, VariableId id, Step step, ElementRange range, DType dtype,
                   std::span<const std::byte> data, PushedGradient gradient) override;
  void replay_register_table(TableSpec& spec) override;
  void replay_push_rows(WorkerId worker, VariableId table, Step step, DType dtype,
                        std::span<const uint64_t> ids, std::span<const std::byte> data) override;
  void replay_timeout(VariableId id, Step step, const std::string& record) override {
    steps_.replay_timeout(id, step, record);
  }
  void replay_join(WorkerId worker, Step from, const std::string& record) override {
    steps_.replay_join(worker, from, record);
  }
  void replay_leave(WorkerId worker, const std::string& record) override {
    steps_.replay_leave(worker, record);
  }

  ShardSettings settings_;
  ForkJoinPool* apply_pool_;
  optim::ComputeDevice* device_;
  // Loop-owned state:
  std::vector<Hosted> hosted_;  // index = VariableId
  std::vector<Variable> variables_;
  std::vector<RowTable> tables_;
  // By table, as tables_: rows pushed and pulled (ShardStats::table_stats).
  struct TableCounts {
    uint64_t pushed = 0;
    uint64_t pulled = 0;
  };
  std::vector<TableCounts> table_counts_;
  size_t saving_ = 0;  // the first table a checkpoint's stream may still have rows of
  std::unordered_map<std::string, VariableId> by_name_;
  ShardStats stats_;                       // what the step machine does not keep
  std::deque<RecentError> recent_errors_;  // the newest kRecentErrors
  StepMachine steps_;
  ShardDurability durability_;
};

}  // namespace psched
