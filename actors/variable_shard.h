// VariableShard: the server-side actor that owns a set of variables (or this shard's ranges of
// large ones) and their optimizer state, applies received partitions, and answers polls
// through its PollRegistry.
//
// Every public method hops onto the shard's strand and replies there through the callback it
// was given. Borrowed spans (initial values, gradients) must stay alive until the reply runs:
// the RPC glue passes views into the received message, which lives until it answers.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/actor.h"
#include "actors/poll_registry.h"
#include "actors/variable.h"
#include "common/buffer_pool.h"
#include "common/error.h"
#include "common/histogram.h"
#include "config/deployment.h"

namespace psched {

struct ShardSettings {
  ShardId id;
  Mode mode = Mode::async;
  uint32_t workers = 1;
  uint64_t max_variables = 1 << 20;
};

// A request a shard failed, kept for operators (VariableShard keeps the newest few).
struct RecentError {
  std::chrono::system_clock::time_point time;
  ErrorCode code;
  std::string message;
};

// Counters a shard keeps; read with VariableShard::stats. A copy: reading never touches the
// live counters, which only the shard's strand updates.
struct ShardStats {
  uint64_t variables = 0;
  uint64_t bytes_received = 0;  // gradient payload bytes accepted
  uint64_t bytes_sent = 0;      // value bytes answered to polls and pulls
  uint64_t partitions_applied = 0;
  uint64_t pushes_rejected = 0;
  uint64_t polls_waiting = 0;
  Histogram apply_seconds;      // per accepted push: validating and applying (or summing) it
  Histogram poll_wait_seconds;  // per answered poll: from its arrival to its answer
  std::array<uint64_t, kErrorCodeCount> errors{};  // failed requests, indexed by ErrorCode
  std::vector<RecentError> recent_errors;          // the newest kRecentErrors, oldest first
};

// One hosted variable part and its progress; read with VariableShard::variables.
struct VariableStatus {
  std::string name;
  ElementRange part;
  Step step = 0;  // the newest complete step (async: of the furthest worker)
};

class VariableShard : public Actor {
 public:
  static constexpr size_t kRecentErrors = 16;

  using RegisterReply = std::function<void(std::exception_ptr, VariableId, bool created)>;
  using Receipt = std::function<void(std::exception_ptr)>;
  // The value of the requested range (in a pooled buffer) and the step it reflects.
  using ValueReply = std::function<void(std::exception_ptr, PooledBuffer, Step)>;

  // `apply_pool` (optional) applies large partitions on several threads; it outlives the shard.
  // `device` (optional, outlives the shard) holds the variables and applies their updates
  // instead (a GPU); the apply pool is then unused.
  VariableShard(IoContext& io, ShardSettings settings, std::shared_ptr<BufferPool> pool,
                ForkJoinPool* apply_pool = nullptr, optim::ComputeDevice* device = nullptr);
  ~VariableShard();

  // Registers this shard's `part` of a variable with `initial` (part.size() elements).
  // Idempotent for the same spec; a different spec for the name fails with spec_conflict.
  void register_variable(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                         RegisterReply reply);
  // Applies (async) or accumulates (sync) one partition of `worker`'s step-`step` gradient.
  void push(WorkerId worker, VariableId variable, Step step, ElementRange range, DType dtype,
            std::span<const std::byte> data, Receipt reply);
  // Answers with the fresh value of `range` once `step`'s update of it is applied.
  // `ticket` (unique per shard) lets the caller withdraw the poll.
  void poll(WorkerId worker, VariableId variable, Step step, ElementRange range, PollTicket ticket,
            ValueReply reply);
  // Forgets a waiting poll unanswered (its caller went away).
  void withdraw_poll(PollTicket ticket);
  // Answers with the current value of `range` at once.
  void pull(VariableId variable, ElementRange range, ValueReply reply);
  void stats(std::function<void(ShardStats)> reply);
  // Answers with the first `limit` hosted variable parts, in registration order.
  void variables(size_t limit, std::function<void(std::vector<VariableStatus>)> reply);
  // Counts an error the RPC layer answered for this shard before the request reached it.
  void report_error(std::exception_ptr error);
  // Fails every waiting poll (the server is stopping), then calls `done` on the strand.
  void shut_down(std::function<void()> done);

 private:
  // The variable, or throws unknown_variable naming `what` ("push", "poll", ...).
  Variable& find(const char* what, VariableId id);
  void do_register(VariableSpec& spec, ElementRange part, std::span<const std::byte> initial,
                   const RegisterReply& reply);
  void do_push(WorkerId worker, VariableId id, Step step, ElementRange range, DType dtype,
               std::span<const std::byte> data);
  // Copies `reply` (the caller's copy can still fail the poll if filing it throws).
  void do_poll(WorkerId worker, VariableId id, Step step, ElementRange range, PollTicket ticket,
               ValueReply& reply);
  void answer(const Variable& variable, ElementRange range, Step step, const ValueReply& reply);
  // Counts a failed request and keeps it among the recent errors. On strand.
  void count_error(std::exception_ptr error);

  ShardSettings settings_;
  std::shared_ptr<BufferPool> pool_;
  ForkJoinPool* apply_pool_;
  optim::ComputeDevice* device_;
  // Strand-owned state:
  PollRegistry polls_;
  std::vector<Variable> variables_;  // index = VariableId
  std::unordered_map<std::string, VariableId> by_name_;
  ShardStats stats_;
  std::deque<RecentError> recent_errors_;  // the newest kRecentErrors
};

}  // namespace psched
