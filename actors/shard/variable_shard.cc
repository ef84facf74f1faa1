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
  if (id.value >= hosted_.size() || hosted_[id.value].kind != Hosted::Kind::variable)
    fail(ErrorCode::unknown_variable, "{} rejected: no variable with id {} on shard {}", what,
         id.value, settings_.id.value);
  return variables_[hosted_[id.value].index];
}

RowTable& VariableShard::find_table(const char* what, VariableId id) {
  if (id.value >= hosted_.size() || hosted_[id.value].kind != Hosted::Kind::table)
    fail(ErrorCode::unknown_variable, "{} rejected: no table with id {} on shard {}", what,
         id.value, settings_.id.value);
  return tables_[hosted_[id.value].index];
}

std::optional<VariableId> VariableShard::registered(const std::string& name,
                                                    Hosted::Kind kind) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  if (hosted_[it->second.value].kind != kind)
    fail(ErrorCode::spec_conflict, "register of '{}' rejected: a {} of that name is registered",
         name, kind == Hosted::Kind::table ? "dense variable" : "table");
  return it->second;
}

VariableId VariableShard::add_hosted(const std::string& name, Hosted::Kind kind,
                                     ElementRange extent) {
  if (hosted_.size() >= settings_.max_variables)
    fail(ErrorCode::invalid_argument,
         "register of '{}' rejected: shard {} holds {} variables and tables, the configured limit",
         name, settings_.id.value, hosted_.size());
  const VariableId id(static_cast<uint32_t>(hosted_.size()));
  const size_t index = kind == Hosted::Kind::table ? tables_.size() : variables_.size();
  hosted_.push_back({kind, static_cast<uint32_t>(index)});
  steps_.add(name, extent);
  by_name_.emplace(name, id);
  return id;
}

void VariableShard::register_variable(VariableSpec spec, ElementRange part,
                                      std::span<const std::byte> initial, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), part, initial, reply = std::move(reply)]() mutable {
    reply(counted(attempt([&] { return do_register(spec, part, initial); })));
  });
}

VariableShard::Registration VariableShard::do_register(VariableSpec& spec, ElementRange part,
                                                       std::span<const std::byte> initial) {
  if (auto id = registered(spec.name, Hosted::Kind::variable)) {
    const Variable& existing = find("register", *id);
    if (!existing.spec().same_variable(spec) || existing.part() != part)
      fail(ErrorCode::spec_conflict,
           "register of variable '{}' rejected: it is registered with a different spec "
           "(shape, dtype, optimizer or shard part differ)",
           spec.name);
    return {*id, false};
  }
  Variable::check_part(spec, part, initial);
  durability_.log_register(spec, part, initial);
  const VariableId id = add_hosted(spec.name, Hosted::Kind::variable, part);
  variables_.emplace_back(std::move(spec), part, initial, apply_pool_, device_);
  stats_.variables = variables_.size();
  return {id, true};
}

void VariableShard::register_table(TableSpec spec, RegisterReply reply) {
  dispatch([this, spec = std::move(spec), reply = std::move(reply)]() mutable {
    reply(counted(attempt([&] {
      for (const TableConfig& declared : settings_.tables)
        if (declared.name == spec.name) RowTable::declare(spec, declared);
      return do_register_table(spec);
    })));
  });
}

VariableShard::Registration VariableShard::do_register_table(TableSpec& spec) {
  if (auto id = registered(spec.name, Hosted::Kind::table)) {
    if (!find_table("register", *id).spec().same_table(spec))
      fail(ErrorCode::spec_conflict,
           "register of table '{}' rejected: it is registered with a different spec (rows, "
           "dim, dtype, optimizer, init or seed differ)",
           spec.name);
    return {*id, false};
  }
  RowTable::check_spec(spec);
  durability_.log_register_table(spec);
  const VariableId id = add_hosted(spec.name, Hosted::Kind::table, {0, spec.parts});
  tables_.emplace_back(std::move(spec));
  table_counts_.emplace_back();
  stats_.tables = tables_.size();
  return {id, true};
}

void VariableShard::push_rows(RowPush push, Receipt reply) {
  dispatch(
      [this, push, reply = std::move(reply)] { reply(take_push([&] { do_push_rows(push); })); });
}

void VariableShard::do_push_rows(const RowPush& p) {
  RowTable& table = find_table("push", p.table);
  table.check_rows("push", p.ids, p.dtype, p.data.size());
  check_table_bytes(table, p.ids);
  std::vector<uint64_t> ids_kept;
  std::vector<std::byte> kept;
  const auto parts = table.by_part(p.ids, p.data, ids_kept, kept);
  std::vector<StepMachine::Admission> admitted;  // every part's first: all or nothing
  for (const RowTable::PartRows& part : parts)
    admitted.push_back(steps_.admit(p.worker, p.table, p.step, {part.part, part.part + 1}));
  const auto fresh = std::count(admitted.begin(), admitted.end(), StepMachine::Admission::fresh);
  stats_.pushes_duplicate +=
      std::count(admitted.begin(), admitted.end(), StepMachine::Admission::duplicate) > 0;
  if (fresh == 0) return;
  durability_.log_push_rows(p.worker, p.table, p.step, p.dtype, p.ids, p.data);
  for (size_t k = 0; k < parts.size(); ++k) {
    if (admitted[k] != StepMachine::Admission::fresh) continue;
    const uint32_t part = parts[k].part;
    const StepUpdate update = steps_.receive(p.worker, p.table, p.step, {part, part + 1});
    table.take(update, part, parts[k].ids, parts[k].gradients);
    steps_.applied(p.worker, p.table, update, Clock::now());
  }
  stats_.bytes_received += p.data.size();
  table_counts_[hosted_[p.table.value].index].pushed += p.ids.size();
}

void VariableShard::check_table_bytes(const RowTable& table, std::span<const uint64_t> ids) const {
  if (settings_.max_table_bytes == 0) return;
  const uint64_t growth = table.growth_bytes(ids);
  if (growth == 0) return;
  uint64_t held = 0;
  for (const RowTable& t : tables_) held += t.bytes_held();
  if (held + growth > settings_.max_table_bytes)
    fail(ErrorCode::overloaded,
         "push of table '{}' rejected: its new rows would take the tables of shard {} from {} "
         "to about {} bytes, over limits.max_table_bytes ({}); bound the table (max_rows) or "
         "raise the limit",
         table.spec().name, settings_.id.value, held, held + growth, settings_.max_table_bytes);
}

void VariableShard::pull_rows(RowPull pull, RowsReply reply) {
  dispatch([this, pull, reply = std::move(reply)] { file_pull_rows(pull, reply); });
}

void VariableShard::file_pull_rows(const RowPull& pull, const RowsReply& reply) {
  const auto now = Clock::now();
  Result<> filed = counted(attempt([&] {
    const RowTable& table = find_table("pull", pull.table);
    table.check_rows("pull", pull.ids, table.spec().dtype,
                     pull.ids.size() * table.spec().row_bytes());
    const Poll poll{pull.worker, pull.table, pull.step, table.parts_of(pull.ids), pull.ticket};
    steps_.poll(
        poll,
        [this, pull, reply, now](const Result<>& ready) {
          if (!ready) return reply(ready.error());
          stats_.poll_wait_seconds.observe(seconds_since(now));
          FreshRows rows(tables_[hosted_[pull.table.value].index], pull.ids,
                         steps_.track(pull.table).applied_step(pull.worker));
          stats_.bytes_sent += rows.bytes();
          table_counts_[hosted_[pull.table.value].index].pulled += pull.ids.size();
          reply(rows);
        },
        now);
  }));
  if (!filed) reply(filed.error());
}

void VariableShard::push(Push push, Receipt reply) {
  dispatch([this, push, reply = std::move(reply)] { reply(take_push([&] { do_push(push); })); });
}

Result<> VariableShard::take_push(const std::function<void()>& apply) {
  auto start = Clock::now();
  Result<> taken = counted(attempt(apply));
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
    Result<> taken = take_push([&] { do_push(push); });
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
          answer(variables_[hosted_[poll.variable.value].index], poll.range,
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
    answer(find("pull", variable), range, steps_.track(variable).applied_step(kAllWorkers), reply);
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
    for (const Variable& v : variables_) {
      s.delta_pulls.published += v.deltas().published();
      s.delta_pulls.held_bytes += v.deltas().bytes();
    }
    steps_.report(s);
    report_tables(s);
    s.recent_errors.assign(recent_errors_.begin(), recent_errors_.end());
    reply(std::move(s));
  });
}

void VariableShard::variables(size_t limit,
                              std::function<void(std::vector<VariableStatus>)> reply) {
  dispatch([this, limit, reply = std::move(reply)] {
    std::vector<VariableStatus> out;
    out.reserve(std::min(limit, variables_.size()));
    for (uint32_t i = 0; i < hosted_.size() && out.size() < limit; ++i) {
      if (hosted_[i].kind != Hosted::Kind::variable) continue;
      const Variable& variable = variables_[hosted_[i].index];
      out.push_back(
          {variable.spec().name, variable.part(), steps_.track(VariableId(i)).latest_step()});
    }
    reply(std::move(out));
  });
}

void VariableShard::report_tables(ShardStats& stats) const {
  stats.table_bytes_limit = settings_.max_table_bytes;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const RowTable& table = tables_[i];
    const RowCapacity& capacity = table.capacity();
    stats.table_stats.push_back({table.spec().name, table.rows(), table.bytes_held(),
                                 table.payload_bytes(), table.rows() + capacity.evictions(),
                                 table_counts_[i].pushed, table_counts_[i].pulled,
                                 table.spec().max_rows, capacity.evictions(), capacity.dropped()});
  }
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
  if (variable.value < hosted_.size() && hosted_[variable.value].kind == Hosted::Kind::variable) {
    Variable& v = variables_[hosted_[variable.value].index];
    reply = v.deltas().answer(v.spec().dtype, range, current, ask, body);
  }
  ++(reply.delta ? stats_.delta_pulls.deltas : stats_.delta_pulls.full);
  return reply;
}

void VariableShard::count_error(const Error& error) {
  ++stats_.errors[static_cast<size_t>(error.code())];
  if (recent_errors_.size() == kRecentErrors) recent_errors_.pop_front();
  recent_errors_.push_back({std::chrono::system_clock::now(), error.code(), error.what()});
}

void VariableShard::apply_gathered(VariableId id, const StepUpdate& update) {
  const Hosted hosted = hosted_[id.value];
  if (hosted.kind == Hosted::Kind::table) return tables_[hosted.index].apply_gathered(update);
  variables_[hosted.index].apply_gathered(update);
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
    report.tables = tables_.size();
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

}  // namespace psched
