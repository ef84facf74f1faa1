// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable_shard.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "actors/shard/row_table.h"
#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

// The calling thread runs only on what the others leave (SCHED_IDLE): a version loaded or
// freed beside the one served takes longer, not the answers' time. A refusal (a kernel
// without it) leaves the thread as it was.
void run_below_the_rest() {
  sched_param param{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) != 0)
    log_warn("a serving shard's load runs at the priority of its answers (no SCHED_IDLE)");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

VariableShard::VariableShard(ActorLoop& loop, ShardSettings settings, ForkJoinPool* apply_pool,
                             optim::ComputeDevice* device)
    : Actor(loop),
      settings_(settings),
      apply_pool_(apply_pool),
      device_(device),
      steps_(loop, settings_, *this),
      durability_(loop, settings_, *this) {}

VariableShard::~VariableShard() {
  *alive_ = false;
  if (loader_.joinable()) loader_.join();
}

void VariableShard::refuse_if_serving(const std::string& what) const {
  if (served_)
    fail(ErrorCode::read_only,
         "{} refused: shard {} serves {} (generation {}, step {}) read-only (psched-server "
         "--serve); train on the job's own shards",
         what, settings_.id.value, served_->checkpoint.string(), served_->generation,
         served_->step);
}

HostedKind& VariableShard::find(const char* what, VariableId id) {
  if (id.value >= hosted_.size())
    fail(ErrorCode::unknown_variable, "{} rejected: no variable or table with id {} on shard {}",
         what, id.value, settings_.id.value);
  return *hosted_[id.value];
}

VariableShard::Registration VariableShard::enroll(Enrollment& enrollment) {
  if (auto it = by_name_.find(enrollment.name()); it != by_name_.end()) {
    enrollment.check_same(*hosted_[it->second.value]);
    return {it->second, false};
  }
  refuse_if_serving(fmt::format("register of '{}', which it does not hold,", enrollment.name()));
  enrollment.check();
  if (hosted_.size() >= settings_.max_variables)
    fail(ErrorCode::invalid_argument,
         "register of '{}' rejected: shard {} holds {} variables and tables, the configured limit",
         enrollment.name(), settings_.id.value, hosted_.size());
  enrollment.log(durability_);
  return {add(enrollment.make()), true};
}

VariableId VariableShard::add(std::unique_ptr<HostedKind> kind) {
  const VariableId id(static_cast<uint32_t>(hosted_.size()));
  steps_.add(kind->name(), kind->extent(), kind->step_rule(settings_));
  by_name_.emplace(kind->name(), id);
  hosted_.push_back(std::move(kind));
  return id;
}

void VariableShard::register_variable(VariableSpec spec, ElementRange part,
                                      std::span<const std::byte> initial, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), part, initial, reply = std::move(reply)]() mutable {
    reply(counted(attempt([&] {
      return enroll(*enroll_variable(std::move(spec), part, initial, apply_pool_, device_));
    })));
  });
}

void VariableShard::register_table(TableSpec spec, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), reply = std::move(reply)]() mutable {
    reply(counted(attempt([&] {
      for (const TableConfig& declared : settings_.tables)
        if (declared.name == spec.name) RowTable::declare(spec, declared);
      return enroll(*enroll_table(std::move(spec)));
    })));
  });
}

void VariableShard::push(Push push, Receipt reply) {
  dispatch([this, push, reply = std::move(reply)] { take_push(push, reply); });
}

void VariableShard::push_poll(Push push, PollTicket ticket, Receipt receipt, ValueReply reply) {
  dispatch([this, push, ticket, receipt = std::move(receipt), reply = std::move(reply)] {
    take_push(push, [this, push, ticket, receipt, reply](const Result<>& taken) {
      receipt(taken);
      if (taken) file_poll({push.worker, push.variable, push.step, push.range, ticket}, reply);
    });
  });
}

void VariableShard::take_push(const Push& push, const Receipt& reply) {
  const auto start = Clock::now();
  HostedKind* kind = nullptr;
  ElementRange units;
  Result<> checked = counted(attempt([&] {
    kind = &find("push", push.variable);
    refuse_if_serving(fmt::format("push to '{}'", kind->name()));
    units = kind->check_push(push);
    check_stored_bytes(*kind, push);
  }));
  if (!checked) {
    ++stats_.pushes_rejected;
    return reply(checked);
  }
  steps_.take(
      *kind, push, units, start,
      [this, kind, push, start, reply](const Result<StepMachine::Admission>& taken, bool held) {
        if (!taken) {
          if (!held) count_error(taken.error());  // held: the machine counted it
          ++stats_.pushes_rejected;
          return reply(taken.error());
        }
        if (*taken == StepMachine::Admission::duplicate) ++stats_.pushes_duplicate;
        if (*taken == StepMachine::Admission::fresh) {
          stats_.bytes_received += push.data.size();
          kind->count_push(push);
        }
        if (!held) stats_.apply_seconds.observe(seconds_since(start));
        reply(Result<>());
      });
}

void VariableShard::check_stored_bytes(const HostedKind& kind, const Push& push) const {
  if (settings_.max_table_bytes == 0) return;
  const uint64_t growth = kind.growth_bytes(push);
  if (growth == 0) return;
  uint64_t held = 0;
  for (const auto& hosted : hosted_) held += hosted->stored_bytes();
  if (held + growth > settings_.max_table_bytes)
    fail(ErrorCode::overloaded,
         "push of table '{}' rejected: its new rows would take the tables of shard {} from {} "
         "to about {} bytes, over limits.max_table_bytes ({}); bound the table (max_rows) or "
         "raise the limit",
         kind.name(), settings_.id.value, held, held + growth, settings_.max_table_bytes);
}

void VariableShard::poll(Poll poll, ValueReply reply) {
  dispatch([this, poll, reply = std::move(reply)] { file_poll(poll, reply); });
}

void VariableShard::file_poll(const Poll& poll, const ValueReply& reply) {
  const auto now = Clock::now();
  Result<> filed = counted(attempt([&] {
    const ElementRange units = find("poll", poll.variable).check_poll("poll", poll);
    if (served_) {  // no step comes: what it holds is the answer
      stats_.poll_wait_seconds.observe(seconds_since(now));
      return answer(poll.variable, poll, Step(served_->step), reply);
    }
    steps_.poll(
        {poll.worker, poll.variable, poll.step, units, poll.ticket},
        [this, poll, reply, now](const Result<>& ready) {
          if (!ready) return reply(ready.error());
          stats_.poll_wait_seconds.observe(seconds_since(now));
          answer(poll.variable, poll, steps_.track(poll.variable).applied_step(poll.worker), reply);
        },
        now);
  }));
  if (!filed) reply(filed.error());
}

void VariableShard::withdraw_poll(PollTicket ticket) {
  dispatch([this, ticket] { steps_.withdraw(ticket); });
}

void VariableShard::pull(VariableId variable, ElementRange range, ValueReply reply) {
  dispatch([=, this, reply = std::move(reply)] {
    const Poll poll{kAllWorkers, variable, Step(), range, PollTicket()};
    Result<> found = counted(attempt([&] { find("pull", variable).check_poll("pull", poll); }));
    if (!found) return reply(found.error());
    answer(variable, poll,
           served_ ? Step(served_->step) : steps_.track(variable).applied_step(kAllWorkers), reply);
  });
}

void VariableShard::answer(VariableId id, const Poll& poll, Step step, const ValueReply& reply) {
  HostedKind& kind = *hosted_[id.value];
  FreshValue value(kind, poll, step, !served_);
  stats_.bytes_sent += value.bytes();
  kind.count_answer(poll);
  reply(value);
}

void VariableShard::connected(WorkerId worker) {
  dispatch([this, worker] {
    if (!served_) steps_.connected(worker);  // serving: no step comes, none may complete
  });
}

void VariableShard::disconnected(WorkerId worker) {
  dispatch([this, worker] {
    if (!served_) steps_.disconnected(worker, Clock::now());
  });
}

void VariableShard::join(WorkerId worker, Step at_least, JoinReply reply) {
  dispatch([this, worker, at_least, reply = std::move(reply)] {
    if (served_) return reply(at_least);  // no steps: every worker reads what is served
    reply(counted(attempt([&] { return steps_.join(worker, at_least, Clock::now()); })));
  });
}

void VariableShard::enforce_deadlines(Clock::time_point now) {
  dispatch([this, now] {
    if (!served_) steps_.enforce(now);
  });
}

void VariableShard::short_handed(size_t limit,
                                 std::function<void(std::vector<ShortHanded>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] { reply(steps_.short_handed(limit)); });
}

void VariableShard::stats(std::function<void(ShardStats)> reply) {
  dispatch([this, reply = std::move(reply)] {
    ShardStats s = stats_;
    for (const auto& kind : hosted_) kind->report(s);
    s.table_bytes_limit = settings_.max_table_bytes;
    s.job = job();
    s.slot_epoch = slot_map().epoch();
    s.slot_shards = slot_map().shards();
    s.slots_owned = slot_map().slots_of(settings_.id.value);
    s.served = served_;
    steps_.report(s);
    s.recent_errors.assign(recent_errors_.begin(), recent_errors_.end());
    reply(std::move(s));
  });
}

void VariableShard::variables(size_t limit,
                              std::function<void(std::vector<VariableStatus>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] {
    std::vector<VariableStatus> out;
    for (uint32_t i = 0; i < hosted_.size() && out.size() < limit; ++i)
      if (auto status = hosted_[i]->status(steps_.track(VariableId(i)).latest_step()))
        out.push_back(std::move(*status));
    reply(std::move(out));
  });
}

void VariableShard::report_error(const Error& error) {
  dispatch([this, error] { count_error(error); });
}

void VariableShard::count_wire_bytes(bool push, uint64_t raw, uint64_t sent) {
  dispatch([this, push, raw, sent] {
    WireBytes& counted = push ? stats_.push_wire : stats_.pull_wire;
    counted.raw += raw;
    counted.sent += sent;
  });
}

DeltaReply VariableShard::answer_delta(VariableId variable, ElementRange range,
                                       std::span<const std::byte> current, const DeltaAsk& ask,
                                       std::vector<std::byte>& body) {
  DeltaReply reply;
  // A serving shard answers in full: its versions change under the copy an answer carries.
  HostedKind* kind =
      !served_ && variable.value < hosted_.size() ? hosted_[variable.value].get() : nullptr;
  if (ValueDeltas* deltas = kind ? kind->deltas() : nullptr)
    reply = deltas->answer(kind->dtype(), range, current, ask, body);
  ++(reply.delta ? stats_.delta_pulls.deltas : stats_.delta_pulls.full);
  return reply;
}

void VariableShard::count_error(const Error& error) {
  ++stats_.errors[static_cast<size_t>(error.code())];
  if (recent_errors_.size() == kRecentErrors) recent_errors_.pop_front();
  recent_errors_.push_back({std::chrono::system_clock::now(), error.code(), error.what()});
}

void VariableShard::apply_gathered(VariableId id, const StepUpdate& update) {
  hosted_[id.value]->apply_gathered(update);
}

void VariableShard::shut_down(std::function<void()> done) {
  dispatch([this, done = std::move(done)] {
    steps_.fail_all(Error(ErrorCode::disconnected, "poll abandoned: the shard is shutting down"));
    done();
  });
}

void VariableShard::restore(std::function<void(std::exception_ptr, RestoreReport)> reply) {
  dispatch([this, reply = std::move(reply)] {
    RestoreReport report;
    try {
      durability_.restore(report);
    } catch (...) {
      return reply(std::current_exception(), std::move(report));
    }
    ++stats_.checkpoints_written;
    ShardStats hosted;
    for (const auto& kind : hosted_) kind->report(hosted);
    report.variables = hosted.variables;
    report.tables = hosted.tables;
    steps_.resumed(Clock::now());  // a job under way resumes
    reply(nullptr, std::move(report));
  });
}

void VariableShard::checkpoint(
    std::function<void(std::exception_ptr, std::filesystem::path)> reply) {
  dispatch([this, reply = std::move(reply)]() mutable {
    try {
      refuse_if_serving("checkpoint");
      durability_.checkpoint([this, reply](std::exception_ptr error, std::filesystem::path file) {
        if (error) {
          count_error(to_error(error));
          return reply(error, {});
        }
        ++stats_.checkpoints_written;
        reply(nullptr, file);
      });
    } catch (...) {
      count_error(caught());
      reply(std::current_exception(), {});
    }
  });
}

std::optional<ServedVersion> VariableShard::load_version(uint64_t newer_than) {
  const ShardStore::Checkpoint found = ShardDurability::newest_served(settings_);
  if (found.generation <= newer_than) return std::nullopt;
  return load_found(found);
}

ServedVersion VariableShard::load_found(const ShardStore::Checkpoint& found) {
  ServedVersion version = durability_.load_served(found);
  for (uint32_t i = 0; i < hosted_.size(); ++i)
    version.step = std::max(version.step, steps_.track(VariableId(i)).latest_step().value);
  return version;
}

void VariableShard::serve(ShardStore::Checkpoint first,
                          std::function<void(std::exception_ptr, ServedVersion)> reply) {
  dispatch([this, first = std::move(first), reply = std::move(reply)] {
    try {
      served_ = load_found(first);
      ++stats_.versions_loaded;
    } catch (...) {
      return reply(std::current_exception(), {});
    }
    reply(nullptr, *served_);
  });
}

void VariableShard::reload(ReloadReply reply) {
  dispatch([this, reply = std::move(reply)]() mutable {
    Result<> started = attempt([&] {
      if (!served_)
        fail(ErrorCode::bad_config,
             "reload refused: shard {} serves nothing (psched-server --serve)", settings_.id.value);
      if (loading_)
        fail(ErrorCode::overloaded, "reload refused: shard {} is loading a version already",
             settings_.id.value);
    });
    if (started && loader_.joinable()) loader_.join();  // the last load: it posted its outcome
    if (started)
      started = attempt([&] {
        // Built here (an actor is built on its loop's thread), loaded on the loader thread,
        // which alone touches it until the outcome is posted back; destroyed back here.
        auto next = std::make_shared<VariableShard>(loop(), settings_, apply_pool_, device_);
        loader_ = std::thread([this, next = std::move(next), newer_than = served_->generation,
                               alive = alive_, reply]() mutable {
          load_beside(std::move(next), newer_than, std::move(alive), std::move(reply));
        });
      });
    if (!started) {
      ++stats_.reloads_refused;
      count_error(started.error());
      return reply(std::make_exception_ptr(started.error()), std::nullopt);
    }
    loading_ = true;
  });
}

void VariableShard::load_beside(std::shared_ptr<VariableShard> next, uint64_t newer_than,
                                std::shared_ptr<bool> alive, ReloadReply reply) {
  run_below_the_rest();
  std::exception_ptr error;
  std::optional<ServedVersion> version;
  try {
    version = next->load_version(newer_than);
  } catch (...) {
    error = std::current_exception();
  }
  loop().post([this, next = std::move(next), version = std::move(version), error,
               alive = std::move(alive), reply = std::move(reply)]() mutable {
    if (*alive) loaded(*next, std::move(version), error, reply);
  });
}

void VariableShard::loaded(VariableShard& next, std::optional<ServedVersion> version,
                           std::exception_ptr error, const ReloadReply& reply) {
  loading_ = false;
  if (!error && version) {
    try {
      take_version(next, *version);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    ++stats_.reloads_refused;
    count_error(to_error(error));
    version.reset();
    release(std::move(next.hosted_));  // what was loaded, refused
  }
  reply(error, version);
}

void VariableShard::take_version(VariableShard& next, const ServedVersion& version) {
  if (next.job() != job() || next.slot_map() != slot_map())
    fail(ErrorCode::bad_config,
         "reload of shard {} refused: {} is of job {:016x} on slot map epoch {}, and the shard "
         "serves job {:016x} on epoch {}; start the serving shards on it instead",
         settings_.id.value, version.checkpoint.string(), next.job(), next.slot_map().epoch(),
         job(), slot_map().epoch());
  std::vector<VariableId> in_next;  // by id served: its id in `next`
  for (const auto& kind : hosted_) {
    auto it = next.by_name_.find(kind->name());
    if (it == next.by_name_.end())
      fail(ErrorCode::bad_config, "reload of shard {} refused: {} holds no '{}', which it serves",
           settings_.id.value, version.checkpoint.string(), kind->name());
    check_same_kind(*kind, *next.hosted_[it->second.value]);
    in_next.push_back(it->second);
  }
  std::vector<std::unique_ptr<HostedKind>> old(hosted_.size());
  for (size_t id = 0; id < hosted_.size(); ++id) {
    old[id] = std::move(hosted_[id]);
    hosted_[id] = std::move(next.hosted_[in_next[id].value]);
  }
  for (auto& kind : next.hosted_)  // new in this version: after the ids served
    if (kind) add(std::move(kind));
  served_ = version;
  ++stats_.versions_loaded;
  release(std::move(old));
}

void VariableShard::release(std::vector<std::unique_ptr<HostedKind>> kinds) {
  // Detached: the loop never waits for it (a release under load at SCHED_IDLE may take long),
  // and what it frees refers to nothing else (a serving shard's kinds have no device).
  std::thread([kinds = std::move(kinds)]() mutable {
    run_below_the_rest();
    kinds.clear();
  }).detach();
}

}  // namespace psched
