// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable_shard.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "actors/durability/shard_store.h"
#include "common/error.h"

namespace psched {
namespace {

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

Variable& VariableShard::find(const char* what, VariableId id) {
  if (id.value >= variables_.size())
    fail(ErrorCode::unknown_variable, "{} rejected: no variable with id {} on shard {}", what,
         id.value, settings_.id.value);
  return variables_[id.value];
}

void VariableShard::register_variable(VariableSpec spec, ElementRange part,
                                      std::span<const std::byte> initial, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), part, initial, reply = std::move(reply)]() mutable {
    reply(counted(attempt([&] { return do_register(spec, part, initial); })));
  });
}

VariableShard::Registration VariableShard::do_register(VariableSpec& spec, ElementRange part,
                                                       std::span<const std::byte> initial) {
  if (auto it = by_name_.find(spec.name); it != by_name_.end()) {
    const Variable& existing = variables_[it->second.value];
    if (!existing.spec().same_variable(spec) || existing.part() != part)
      fail(ErrorCode::spec_conflict,
           "register of variable '{}' rejected: it is registered with a different spec "
           "(shape, dtype, optimizer or shard part differ)",
           spec.name);
    return {it->second, false};
  }
  if (variables_.size() >= settings_.max_variables)
    fail(ErrorCode::invalid_argument,
         "register of variable '{}' rejected: shard {} holds {} variables, the configured limit",
         spec.name, settings_.id.value, variables_.size());
  Variable::check_part(spec, part, initial);
  durability_.log_register(spec, part, initial);
  VariableId id(static_cast<uint32_t>(variables_.size()));
  steps_.add(spec.name, part);
  by_name_.emplace(spec.name, id);
  variables_.emplace_back(std::move(spec), part, initial, apply_pool_, device_);
  stats_.variables = variables_.size();
  return {id, true};
}

void VariableShard::push(Push push, Receipt reply) {
  dispatch([this, push, reply = std::move(reply)] { reply(take_push(push)); });
}

Result<> VariableShard::take_push(const Push& push) {
  auto start = Clock::now();
  Result<> taken = counted(attempt([&] { do_push(push); }));
  if (!taken) {
    ++stats_.pushes_rejected;
    return taken;
  }
  stats_.apply_seconds.observe(seconds_since(start));
  return taken;
}

void VariableShard::do_push(const Push& p) {
  Variable& variable = find("push", p.variable);
  variable.check_push(p.range, p.dtype, p.data);
  switch (steps_.admit(p.worker, p.variable, p.step, p.range)) {
    case StepMachine::Admission::duplicate:
      ++stats_.pushes_duplicate;
      return;
    case StepMachine::Admission::late:
      return;
    case StepMachine::Admission::fresh:
      break;
  }
  durability_.log_push(p.worker, p.variable, p.step, p.range, p.dtype, p.data, p.gradient);
  const StepUpdate update = steps_.receive(p.worker, p.variable, p.step, p.range);
  variable.take(update, p.range, p.data, p.gradient);
  stats_.bytes_received += p.data.size();
  steps_.applied(p.worker, p.variable, update, Clock::now());
}

void VariableShard::poll(Poll poll, ValueReply reply) {
  dispatch([this, poll, reply = std::move(reply)] { file_poll(poll, reply); });
}

void VariableShard::push_poll(Push push, PollTicket ticket, Receipt receipt, ValueReply reply) {
  dispatch([this, push, ticket, receipt = std::move(receipt), reply = std::move(reply)] {
    Result<> taken = take_push(push);
    receipt(taken);
    if (taken) file_poll({push.worker, push.variable, push.step, push.range, ticket}, reply);
  });
}

void VariableShard::file_poll(const Poll& poll, const ValueReply& reply) {
  const auto now = Clock::now();
  Result<> filed = counted(attempt([&] {
    find("poll", poll.variable).check_range("poll", poll.range);
    steps_.poll(
        poll,
        [this, poll, reply, now](const Result<>& ready) {
          if (!ready) return reply(ready.error());
          stats_.poll_wait_seconds.observe(seconds_since(now));
          answer(variables_[poll.variable.value], poll.range,
                 steps_.track(poll.variable).applied_step(poll.worker), reply);
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
    Result<> found = counted(attempt([&] { find("pull", variable).check_range("pull", range); }));
    if (!found) return reply(found.error());
    answer(variables_[variable.value], range, steps_.track(variable).applied_step(kAllWorkers),
           reply);
  });
}

void VariableShard::answer(const Variable& variable, ElementRange range, Step step,
                           const ValueReply& reply) {
  FreshValue value(variable, range, step);
  stats_.bytes_sent += value.bytes();
  reply(value);
}

void VariableShard::connected(WorkerId worker) {
  dispatch([this, worker] { steps_.connected(worker); });
}

void VariableShard::disconnected(WorkerId worker) {
  dispatch([this, worker] { steps_.disconnected(worker, Clock::now()); });
}

void VariableShard::join(WorkerId worker, Step at_least, JoinReply reply) {
  dispatch([this, worker, at_least, reply = std::move(reply)] {
    reply(counted(attempt([&] { return steps_.join(worker, at_least, Clock::now()); })));
  });
}

void VariableShard::enforce_deadlines(Clock::time_point now) {
  dispatch([this, now] { steps_.enforce(now); });
}

void VariableShard::short_handed(size_t limit,
                                 std::function<void(std::vector<ShortHanded>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] { reply(steps_.short_handed(limit)); });
}

void VariableShard::stats(std::function<void(ShardStats)> reply) {
  dispatch([this, reply = std::move(reply)] {
    ShardStats s = stats_;
    steps_.report(s);
    s.recent_errors.assign(recent_errors_.begin(), recent_errors_.end());
    reply(std::move(s));
  });
}

void VariableShard::variables(size_t limit,
                              std::function<void(std::vector<VariableStatus>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] {
    std::vector<VariableStatus> out;
    out.reserve(std::min(limit, variables_.size()));
    for (uint32_t i = 0; i < variables_.size() && out.size() < limit; ++i)
      out.push_back({variables_[i].spec().name, variables_[i].part(),
                     steps_.track(VariableId(i)).latest_step()});
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

void VariableShard::apply_gathered(VariableId id, const StepUpdate& update) {
  variables_[id.value].apply_gathered(update);
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
    report.variables = variables_.size();
    steps_.resumed(Clock::now());  // a job under way resumes
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
  steps_.save(out);
  out.put<uint64_t>(variables_.size());
  for (uint32_t i = 0; i < variables_.size(); ++i) {
    variables_[i].save_values(out);
    steps_.track(VariableId(i)).save(out);
    variables_[i].save_sums(out);
  }
}

void VariableShard::load_variables(ByteReader& in, uint32_t checkpoint_format) {
  const uint32_t format =
      checkpoint_format < ShardStore::kFrozenVarianceFormat ? 1 : Variable::kSaveFormat;
  if (checkpoint_format >= ShardStore::kMembershipFormat) steps_.load(in);
  uint64_t count = in.get<uint64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    Variable variable = Variable::restore_values(in, apply_pool_, device_);
    VariableId id(static_cast<uint32_t>(i));
    steps_.add(variable.spec().name, variable.part());
    steps_.load_track(id, in);
    variable.load_sums(in, format, steps_.track(id).updates());
    by_name_.emplace(variable.spec().name, id);
    variables_.push_back(std::move(variable));
  }
  stats_.variables = variables_.size();
}

void VariableShard::replay_register(VariableSpec& spec, ElementRange part,
                                    std::span<const std::byte> initial) {
  do_register(spec, part, initial);
}

void VariableShard::replay_push(WorkerId worker, VariableId id, Step step, ElementRange range,
                                DType dtype, std::span<const std::byte> data,
                                PushedGradient gradient) {
  do_push({worker, id, step, range, dtype, data, gradient});
}

}  // namespace psched
