// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable_shard.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/durability/shard_store.h"
#include "actors/durability/state_codec.h"
#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

using Clock = std::chrono::steady_clock;

// The exception being handled as the refusal a reply carries (other exceptions than
// psched::Error become [internal]).
Error caught() {
  return to_error(std::current_exception());
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

VariableShard::VariableShard(ActorLoop& loop, ShardSettings settings, ForkJoinPool* apply_pool,
                             optim::ComputeDevice* device)
    : Actor(loop),
      settings_(settings),
      apply_pool_(apply_pool),
      device_(device),
      polls_(loop),
      membership_(settings_.workers,
                  settings_.sync.min_workers ? settings_.sync.min_workers : settings_.workers),
      leases_(settings_.workers, settings_.sync.lease_seconds),
      pushed_(settings_.workers),
      durability_(loop, settings_, *this),
      sync_timeouts_(settings_, *this) {}

Variable& VariableShard::find(const char* what, VariableId id) {
  if (id.value >= variables_.size())
    fail(ErrorCode::unknown_variable, "{} rejected: no variable with id {} on shard {}", what,
         id.value, settings_.id.value);
  return variables_[id.value];
}

void VariableShard::register_variable(VariableSpec spec, ElementRange part,
                                      std::span<const std::byte> initial, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), part, initial, reply = std::move(reply)]() mutable {
    try {
      do_register(spec, part, initial, reply);
    } catch (...) {
      Error refused = caught();
      count_error(refused);
      reply(&refused, VariableId(), false);
    }
  });
}

void VariableShard::do_register(VariableSpec& spec, ElementRange part,
                                std::span<const std::byte> initial, const RegisterReply& reply) {
  if (auto it = by_name_.find(spec.name); it != by_name_.end()) {
    const Variable& existing = variables_[it->second.value];
    if (!existing.spec().same_variable(spec) || existing.part() != part)
      fail(ErrorCode::spec_conflict,
           "register of variable '{}' rejected: it is registered with a different spec "
           "(shape, dtype, optimizer or shard part differ)",
           spec.name);
    return reply(nullptr, it->second, false);
  }
  if (variables_.size() >= settings_.max_variables)
    fail(ErrorCode::invalid_argument,
         "register of variable '{}' rejected: shard {} holds {} "
         "variables, the configured limit",
         spec.name, settings_.id.value, variables_.size());
  if (part.begin >= part.end || part.end > spec.elements())
    fail(ErrorCode::offset_out_of_range,
         "register of variable '{}' rejected: part [{}, {}) does not fit its {} elements",
         spec.name, part.begin, part.end, spec.elements());
  if (initial.size() != part.size() * element_bytes(spec.dtype))
    fail(ErrorCode::shape_mismatch,
         "register of variable '{}' rejected: initial value has {} bytes, expected {} ({} "
         "elements of {})",
         spec.name, initial.size(), part.size() * element_bytes(spec.dtype), part.size(),
         to_string(spec.dtype));
  optim::validate(spec.optimizer);
  durability_.log_register(spec, part, initial);
  VariableId id(static_cast<uint32_t>(variables_.size()));
  std::string name = spec.name;
  variables_.emplace_back(std::move(spec), part, initial, settings_.mode, settings_.workers,
                          apply_pool_, device_, members());
  by_name_.emplace(std::move(name), id);
  stats_.variables = variables_.size();
  reply(nullptr, id, true);
}

void VariableShard::push(WorkerId worker, VariableId variable, Step step, ElementRange range,
                         DType dtype, std::span<const std::byte> data, PushedGradient gradient,
                         Receipt reply) {
  dispatch([=, this, reply = std::move(reply)] {
    auto start = Clock::now();
    try {
      do_push(worker, variable, step, range, dtype, data, gradient);
    } catch (...) {
      ++stats_.pushes_rejected;
      Error refused = caught();
      count_error(refused);
      return reply(&refused);
    }
    stats_.apply_seconds.observe(seconds_since(start));
    reply(nullptr);
  });
}

void VariableShard::do_push(WorkerId worker, VariableId id, Step step, ElementRange range,
                            DType dtype, std::span<const std::byte> data, PushedGradient gradient) {
  Variable& variable = find("push", id);
  if (variable.is_duplicate(worker, step, range, dtype, data)) {
    if (!sync_timeouts_.late_push(id, worker, step)) ++stats_.pushes_duplicate;
    return;
  }
  durability_.log_push(worker, id, step, range, dtype, data, gradient);
  std::vector<ElementRange> applied = variable.push_checked(worker, step, range, data, gradient);
  stats_.bytes_received += data.size();
  stats_.partitions_applied += applied.size();
  PollKey key{variable.poll_owner(worker), id, step};
  for (ElementRange r : applied) polls_.applied(key, r);
  if (settings_.mode == Mode::async) return;
  membership_.pushed(worker);
  pushed_[worker.value] = std::max(pushed_[worker.value], step);
  if (settings_.mode == Mode::bounded) return release_held(id);
  keep_short_handed(variable);
  sync_timeouts_.pushed(id, variable, Clock::now());
}

void VariableShard::enforce_deadlines(Clock::time_point now) {
  dispatch([this, now] {
    sync_timeouts_.enforce(now, variables_);
    if (settings_.mode == Mode::async) return;
    if (settings_.mode == Mode::bounded) time_out_held(now);
    for (WorkerId worker : leases_.ended(now)) {
      if (!membership_.is_member(worker)) continue;
      try {
        leave(worker, fmt::format("no connection for {} s (sync.lease_seconds)",
                                  settings_.sync.lease_seconds));
      } catch (...) {
        Error error = caught();
        count_error(error);
        log_error(
            "shard {}: worker {}'s lease ended but its leave could not be logged ({}); "
            "it stays a member",
            settings_.id.value, worker.value, error.what());
      }
    }
  });
}

void VariableShard::connected(WorkerId worker) {
  dispatch([this, worker] {
    if (worker.value < settings_.workers) leases_.connected(worker);
  });
}

void VariableShard::disconnected(WorkerId worker) {
  dispatch([this, worker] {
    if (worker.value < settings_.workers) leases_.disconnected(worker, Clock::now());
  });
}

void VariableShard::join(WorkerId worker, Step at_least, JoinReply reply) {
  dispatch([this, worker, at_least, reply = std::move(reply)] {
    Step from;
    try {
      from = do_join(worker, at_least);
    } catch (...) {
      Error refused = caught();
      count_error(refused);
      return reply(&refused, Step());
    }
    reply(nullptr, from);
  });
}

Step VariableShard::do_join(WorkerId worker, Step at_least) {
  if (worker.value >= settings_.workers)
    fail(ErrorCode::invalid_argument,
         "join rejected: worker id {} is not below the job's {} workers", worker.value,
         settings_.workers);
  if (settings_.mode == Mode::async) return resume_step(worker);
  at_least = std::max(at_least, Step(1));
  Step from;
  if (membership_.is_member(worker) && !membership_.has_pushed(worker))
    from = std::max(membership_.joined_at(worker), at_least);
  else
    from =
        std::max(at_least, settings_.mode == Mode::sync ? frontier().next() : level_step(worker));
  if (from != membership_.joined_at(worker) || membership_.has_pushed(worker))
    join_from(worker, from);
  return from;
}

Step VariableShard::resume_step(WorkerId worker) const {
  std::optional<Step> from;
  for (const Variable& v : variables_) {
    Step next = v.applied_step(worker).next();
    from = from ? std::min(*from, next) : next;
  }
  return from.value_or(Step(1));
}

Step VariableShard::level_step(WorkerId worker) const {
  Step from(1);
  for (const Variable& v : variables_) {
    from = std::max(from, v.applied_step(worker).next());
    std::optional<Step> slowest;
    for (uint32_t w = 0; w < settings_.workers; ++w)
      if (w != worker.value && membership_.is_member(WorkerId(w)))
        slowest = std::min(slowest.value_or(Step(UINT64_MAX)), v.applied_step(WorkerId(w)));
    if (slowest) from = std::max(from, slowest->next());
  }
  return from;
}

Step VariableShard::frontier() const {
  Step newest;
  for (const Variable& v : variables_) newest = std::max(newest, v.begun_step());
  return newest;
}

void VariableShard::join_from(WorkerId worker, Step from) {
  durability_.log_join(worker, from);
  bool rejoined = membership_.has_pushed(worker);
  membership_.join(worker, from);
  if (settings_.mode == Mode::bounded)
    for (Variable& v : variables_) v.skip_to(worker, Step(from.value - 1));
  ++stats_.joins;
  log_info("shard {}: worker {} {} the job at step {} ({} of {} workers members)",
           settings_.id.value, worker.value, rejoined ? "rejoins" : "joins", from,
           membership_.members(), settings_.workers);
  settle_all();
}

void VariableShard::leave(WorkerId worker, std::string_view why) {
  durability_.log_leave(worker);
  membership_.leave(worker);
  ++stats_.leaves;
  log_warn(
      "shard {}: worker {} left the job at step {}: {}; {} of {} workers members{}",
      settings_.id.value, worker.value, frontier(), why, membership_.members(), settings_.workers,
      membership_.quorum()
          ? ""
          : fmt::format(", below sync.min_workers ({}): steps wait", membership_.min_workers()));
  settle_all();
}

void VariableShard::settle_all() {
  if (settings_.mode == Mode::bounded) return release_held(std::nullopt);
  for (uint32_t i = 0; i < variables_.size(); ++i) {
    Variable& variable = variables_[i];
    for (const AppliedRanges& applied : variable.settle()) {
      PollKey key{kAllWorkers, VariableId(i), applied.step};
      stats_.partitions_applied += applied.ranges.size();
      for (ElementRange r : applied.ranges) polls_.applied(key, r);
    }
    keep_short_handed(variable);
    sync_timeouts_.pushed(VariableId(i), variable, Clock::now());
  }
}

std::vector<VariableShard::HeldPoll> VariableShard::take_held(
    const std::function<bool(const HeldPoll&)>& which) {
  std::vector<HeldPoll> taken;
  std::erase_if(held_, [&](HeldPoll& held) {
    if (!which(held)) return false;
    taken.push_back(std::move(held));
    return true;
  });
  return taken;
}

void VariableShard::release_held(std::optional<VariableId> variable) {
  auto ready = take_held([&](const HeldPoll& held) {
    return (!variable || held.variable == *variable) &&
           variables_[held.variable.value].others_reached(held.step, settings_.sync.staleness);
  });
  for (const HeldPoll& held : ready) file_held(held);
}

void VariableShard::file_held(const HeldPoll& held) {
  try {
    file_poll(held.worker, held.variable, held.step, held.range, held.ticket, held.reply);
  } catch (...) {
    Error refused = caught();
    count_error(refused);
    held.reply(&refused, nullptr);
  }
}

void VariableShard::time_out_held(Clock::time_point now) {
  const double timeout = settings_.sync.timeout_seconds;
  if (timeout <= 0) return;
  auto overdue = take_held([&](const HeldPoll& held) {
    return std::chrono::duration<double>(now - held.since).count() >= timeout;
  });
  const bool proceed = settings_.sync.on_timeout == SyncTimeoutAction::proceed;
  for (const HeldPoll& held : overdue) {
    const Variable& variable = variables_[held.variable.value];
    Error error(ErrorCode::sync_timeout,
                fmt::format("a poll of step {} of variable '{}' on shard {} waited {:.1f} s for "
                            "worker(s) {} to push step {} (staleness {}){}",
                            held.step, variable.spec().name, settings_.id.value,
                            std::chrono::duration<double>(now - held.since).count(),
                            fmt::join(variable.behind(held.step, settings_.sync.staleness), ", "),
                            held.step.value - settings_.sync.staleness, settings_.sync.staleness,
                            proceed ? "; answered without them" : ""));
    count_error(error);
    log_warn("{}", error.what());
    if (proceed)
      file_held(held);
    else
      held.reply(&error, nullptr);
  }
}

void VariableShard::keep_short_handed(Variable& variable) {
  for (ShortHanded& record : variable.take_short_handed()) {
    ++stats_.short_handed_ranges;
    record.variable = variable.spec().name;
    if (short_handed_.size() == kShortHandedKept) short_handed_.pop_front();
    short_handed_.push_back(std::move(record));
  }
}

void VariableShard::short_handed(size_t limit,
                                 std::function<void(std::vector<ShortHanded>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] {
    size_t n = std::min(limit, short_handed_.size());
    reply(std::vector<ShortHanded>(short_handed_.end() - static_cast<ptrdiff_t>(n),
                                   short_handed_.end()));
  });
}

void VariableShard::fail_polls(VariableId id, Step step, const Error& error) {
  polls_.fail(PollKey{kAllWorkers, id, step}, error);
}

void VariableShard::complete_without_missing(VariableId id, Step step) {
  durability_.log_timeout(id, step);
  PollKey key{kAllWorkers, id, step};
  for (ElementRange r : variables_[id.value].complete_step_without_missing())
    polls_.applied(key, r);
}

void VariableShard::poll(WorkerId worker, VariableId variable, Step step, ElementRange range,
                         PollTicket ticket, ValueReply reply) {
  dispatch([=, this, reply = std::move(reply)]() mutable {
    try {
      do_poll(worker, variable, step, range, ticket, reply);
    } catch (...) {
      Error refused = caught();
      count_error(refused);
      reply(&refused, nullptr);
    }
  });
}

void VariableShard::withdraw_poll(PollTicket ticket) {
  dispatch([this, ticket] {
    std::erase_if(held_, [ticket](const HeldPoll& held) { return held.ticket == ticket; });
    polls_.withdraw(ticket);
  });
}

void VariableShard::do_poll(WorkerId worker, VariableId id, Step step, ElementRange range,
                            PollTicket ticket, ValueReply& reply) {
  Variable& variable = find("poll", id);
  if (settings_.mode == Mode::bounded) {
    variable.not_yet_applied(worker, step, range);  // its checks, before holding it
    if (!variable.others_reached(step, settings_.sync.staleness)) {
      ++stats_.polls_held;
      held_.push_back({worker, id, step, range, ticket, reply, Clock::now()});
      return;
    }
  }
  file_poll(worker, id, step, range, ticket, reply);
}

void VariableShard::file_poll(WorkerId worker, VariableId id, Step step, ElementRange range,
                              PollTicket ticket, ValueReply reply) {
  const Variable& variable = variables_[id.value];
  IntervalSet pending = variable.not_yet_applied(worker, step, range);
  PollKey key{variable.poll_owner(worker), id, step};
  polls_.wait(key, ticket, std::move(pending),
              [this, id, worker, range, reply, filed = Clock::now()](const Error* refused) {
                if (refused) return reply(refused, nullptr);
                stats_.poll_wait_seconds.observe(seconds_since(filed));
                const Variable& v = variables_[id.value];
                answer(v, range, v.applied_step(worker), reply);
              });
}

void VariableShard::pull(VariableId variable, ElementRange range, ValueReply reply) {
  dispatch([=, this, reply = std::move(reply)] {
    try {
      Variable& v = find("pull", variable);
      v.check_range("pull", range);
      answer(v, range, v.applied_step(kAllWorkers), reply);
    } catch (...) {
      Error refused = caught();
      count_error(refused);
      reply(&refused, nullptr);
    }
  });
}

void VariableShard::answer(const Variable& variable, ElementRange range, Step step,
                           const ValueReply& reply) {
  FreshValue value(variable, range, step);
  stats_.bytes_sent += value.bytes();
  reply(nullptr, &value);
}

void VariableShard::stats(std::function<void(ShardStats)> reply) {
  dispatch([this, reply = std::move(reply)] {
    ShardStats s = stats_;
    s.sync_timeouts = sync_timeouts_.timeouts();
    s.pushes_late = sync_timeouts_.late_pushes();
    s.polls_waiting = polls_.waiting();
    if (settings_.mode != Mode::async) {
      s.members = membership_.members();
      const Step newest = *std::max_element(pushed_.begin(), pushed_.end());
      for (uint32_t w = 0; w < settings_.workers; ++w)
        s.workers.push_back({.worker = w,
                             .member = membership_.is_member(WorkerId(w)),
                             .joined_at = membership_.joined_at(WorkerId(w)),
                             .connections = leases_.connections(WorkerId(w)),
                             .pushed = pushed_[w],
                             .lag_steps = newest.value - pushed_[w].value});
    }
    s.recent_errors.assign(recent_errors_.begin(), recent_errors_.end());
    reply(std::move(s));
  });
}

void VariableShard::variables(size_t limit,
                              std::function<void(std::vector<VariableStatus>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] {
    std::vector<VariableStatus> out;
    out.reserve(std::min(limit, variables_.size()));
    for (size_t i = 0; i < variables_.size() && out.size() < limit; ++i)
      out.push_back({variables_[i].spec().name, variables_[i].part(), variables_[i].latest_step()});
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

void VariableShard::count_error(const Error& error) {
  ++stats_.errors[static_cast<size_t>(error.code())];
  if (recent_errors_.size() == kRecentErrors) recent_errors_.pop_front();
  recent_errors_.push_back({std::chrono::system_clock::now(), error.code(), error.what()});
}

void VariableShard::shut_down(std::function<void()> done) {
  dispatch([this, done = std::move(done)] {
    Error stopping(ErrorCode::disconnected, "poll abandoned: the shard is shutting down");
    for (HeldPoll& held : std::exchange(held_, {})) held.reply(&stopping, nullptr);
    polls_.fail_all(stopping);
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
    report.variables = variables_.size();
    if (frontier() != Step()) leases_.start_all(Clock::now());  // a job under way resumes
    reply(nullptr, std::move(report));
  });
}

void VariableShard::checkpoint(
    std::function<void(std::exception_ptr, std::filesystem::path)> reply) {
  dispatch([this, reply = std::move(reply)]() mutable {
    try {
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

void VariableShard::save_variables(ByteWriter& out) const {
  membership_.save(out);
  save_membership_record(out);
  out.put<uint64_t>(variables_.size());
  for (const Variable& v : variables_) v.save(out);
}

void VariableShard::load_variables(ByteReader& in, uint32_t checkpoint_format) {
  const uint32_t format =
      checkpoint_format < ShardStore::kFrozenVarianceFormat ? 1 : Variable::kSaveFormat;
  if (checkpoint_format >= ShardStore::kMembershipFormat) {
    membership_.load(in);
    load_membership_record(in);
  }
  uint64_t count = in.get<uint64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    variables_.push_back(Variable::restore(in, format, settings_.mode, settings_.workers,
                                           apply_pool_, device_, members()));
    by_name_.emplace(variables_.back().spec().name, VariableId(static_cast<uint32_t>(i)));
  }
  stats_.variables = variables_.size();
}

void VariableShard::save_membership_record(ByteWriter& out) const {
  out.put(stats_.joins);
  out.put(stats_.leaves);
  out.put(stats_.short_handed_ranges);
  out.put<uint64_t>(short_handed_.size());
  for (const ShortHanded& r : short_handed_) {
    out.text(r.variable);
    out.put(r.step.value);
    encode(out, r.range);
    out.put<uint64_t>(r.workers.size());
    for (uint32_t w : r.workers) out.put(w);
  }
}

void VariableShard::load_membership_record(ByteReader& in) {
  stats_.joins = in.get<uint64_t>();
  stats_.leaves = in.get<uint64_t>();
  stats_.short_handed_ranges = in.get<uint64_t>();
  uint64_t records = in.get<uint64_t>();
  if (records > kShortHandedKept)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} short-handed records, more than are kept",
         in.what(), records);
  for (uint64_t i = 0; i < records; ++i) {
    ShortHanded r{.variable = in.text(), .step = Step(in.get<uint64_t>())};
    r.range = decode_range(in);
    uint64_t workers = in.get<uint64_t>();
    if (workers > settings_.workers)
      fail(ErrorCode::corrupt_checkpoint, "{}: a short-handed record of {} workers", in.what(),
           workers);
    for (uint64_t w = 0; w < workers; ++w) r.workers.push_back(in.get<uint32_t>());
    short_handed_.push_back(std::move(r));
  }
}

void VariableShard::replay_register(VariableSpec& spec, ElementRange part,
                                    std::span<const std::byte> initial) {
  do_register(spec, part, initial, [](const Error*, VariableId, bool) {});
}

void VariableShard::replay_push(WorkerId worker, VariableId id, Step step, ElementRange range,
                                DType dtype, std::span<const std::byte> data,
                                PushedGradient gradient) {
  do_push(worker, id, step, range, dtype, data, gradient);
}

void VariableShard::replay_timeout(VariableId id, Step step, const std::string& record) {
  Variable& variable = find("replay", id);
  if (step != variable.applied_step(kAllWorkers).next())
    fail(ErrorCode::corrupt_checkpoint, "{}: a timed-out step out of order", record);
  variable.complete_step_without_missing();
}

void VariableShard::replay_join(WorkerId worker, Step from, const std::string& record) {
  if (settings_.mode == Mode::async || worker.value >= settings_.workers || from == Step())
    fail(ErrorCode::corrupt_checkpoint, "{}: a join of worker {} at step {} that cannot be", record,
         worker.value, from);
  join_from(worker, from);
}

void VariableShard::replay_leave(WorkerId worker, const std::string& record) {
  if (settings_.mode == Mode::async || worker.value >= settings_.workers)
    fail(ErrorCode::corrupt_checkpoint, "{}: a leave of worker {} that cannot be", record,
         worker.value);
  leave(worker, "as logged");
}

}  // namespace psched
