#include "actors/variable_shard.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace psched {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

VariableShard::VariableShard(IoContext& io, ShardSettings settings,
                             std::shared_ptr<BufferPool> pool, ForkJoinPool* apply_pool)
    : Actor(io),
      settings_(settings),
      pool_(std::move(pool)),
      apply_pool_(apply_pool),
      polls_(strand()) {}

VariableShard::~VariableShard() = default;

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
      count_error(std::current_exception());
      reply(std::current_exception(), VariableId(), false);
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
  VariableId id(static_cast<uint32_t>(variables_.size()));
  std::string name = spec.name;
  variables_.emplace_back(std::move(spec), part, initial, settings_.mode, settings_.workers,
                          apply_pool_);
  by_name_.emplace(std::move(name), id);
  stats_.variables = variables_.size();
  reply(nullptr, id, true);
}

void VariableShard::push(WorkerId worker, VariableId variable, Step step, ElementRange range,
                         DType dtype, std::span<const std::byte> data, Receipt reply) {
  dispatch([=, this, reply = std::move(reply)] {
    auto start = Clock::now();
    try {
      do_push(worker, variable, step, range, dtype, data);
    } catch (...) {
      ++stats_.pushes_rejected;
      count_error(std::current_exception());
      return reply(std::current_exception());
    }
    stats_.apply_seconds.observe(seconds_since(start));
    reply(nullptr);
  });
}

void VariableShard::do_push(WorkerId worker, VariableId id, Step step, ElementRange range,
                            DType dtype, std::span<const std::byte> data) {
  Variable& variable = find("push", id);
  std::vector<ElementRange> applied = variable.push(worker, step, range, dtype, data);
  stats_.bytes_received += data.size();
  stats_.partitions_applied += applied.size();
  PollKey key{variable.poll_owner(worker), id, step};
  for (ElementRange r : applied) polls_.applied(key, r);
}

void VariableShard::poll(WorkerId worker, VariableId variable, Step step, ElementRange range,
                         PollTicket ticket, ValueReply reply) {
  dispatch([=, this, reply = std::move(reply)]() mutable {
    try {
      do_poll(worker, variable, step, range, ticket, reply);
    } catch (...) {
      count_error(std::current_exception());
      reply(std::current_exception(), PooledBuffer(), 0);
    }
  });
}

void VariableShard::withdraw_poll(PollTicket ticket) {
  dispatch([this, ticket] { polls_.withdraw(ticket); });
}

void VariableShard::do_poll(WorkerId worker, VariableId id, Step step, ElementRange range,
                            PollTicket ticket, ValueReply& reply) {
  Variable& variable = find("poll", id);
  IntervalSet pending = variable.not_yet_applied(worker, step, range);
  PollKey key{variable.poll_owner(worker), id, step};
  polls_.wait(key, ticket, std::move(pending), variable.spec().priority,
              [this, id, worker, range, reply, filed = Clock::now()](std::exception_ptr error) {
                if (error) return reply(error, PooledBuffer(), 0);
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
      count_error(std::current_exception());
      reply(std::current_exception(), PooledBuffer(), 0);
    }
  });
}

void VariableShard::answer(const Variable& variable, ElementRange range, Step step,
                           const ValueReply& reply) {
  PooledBuffer value = pool_->take(range.size() * element_bytes(variable.spec().dtype));
  variable.read(range, value.data());
  stats_.bytes_sent += value.size();
  reply(nullptr, std::move(value), step);
}

void VariableShard::stats(std::function<void(ShardStats)> reply) {
  dispatch([this, reply = std::move(reply)] {
    ShardStats s = stats_;
    s.polls_waiting = polls_.waiting();
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

void VariableShard::report_error(std::exception_ptr error) {
  dispatch([this, error] { count_error(error); });
}

void VariableShard::count_error(std::exception_ptr error) {
  Error e = to_error(error);
  ++stats_.errors[static_cast<size_t>(e.code())];
  if (recent_errors_.size() == kRecentErrors) recent_errors_.pop_front();
  recent_errors_.push_back({std::chrono::system_clock::now(), e.code(), e.what()});
}

void VariableShard::shut_down(std::function<void()> done) {
  dispatch([this, done = std::move(done)] {
    polls_.fail_all(std::make_exception_ptr(
        Error(ErrorCode::disconnected, "poll abandoned: the shard is shutting down")));
    done();
  });
}

}  // namespace psched
