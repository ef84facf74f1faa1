// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/sync_timeouts.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/shard/variable_shard.h"
#include "common/error.h"
#include "common/log.h"

namespace psched {
namespace {

double seconds_between(SyncTimeouts::Clock::time_point from, SyncTimeouts::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

SyncTimeouts::SyncTimeouts(const ShardSettings& settings, Actions& actions)
    : settings_(settings), actions_(actions) {}

void SyncTimeouts::pushed(VariableId id, const Variable& variable, Clock::time_point now) {
  if (!variable.step_in_progress())
    step_began_.erase(id.value);
  else
    step_began_.try_emplace(id.value, now);
}

bool SyncTimeouts::late_push(VariableId id, WorkerId worker, Step step) {
  auto it = completed_without_.find(id.value);
  if (it == completed_without_.end() || it->second.first != step) return false;
  const auto& missing = it->second.second;
  if (std::find(missing.begin(), missing.end(), worker.value) == missing.end()) return false;
  ++late_pushes_;
  return true;
}

void SyncTimeouts::enforce(Clock::time_point now, const std::vector<Variable>& variables) {
  if (settings_.mode != Mode::sync || settings_.sync.timeout_seconds <= 0) return;
  std::vector<uint32_t> overdue;
  for (const auto& [id, began] : step_began_)
    if (seconds_between(began, now) >= settings_.sync.timeout_seconds) overdue.push_back(id);
  for (uint32_t id : overdue) time_out(VariableId(id), variables[id], now);
}

void SyncTimeouts::time_out(VariableId id, const Variable& variable, Clock::time_point now) {
  Step step = variable.applied_step(kAllWorkers).next();
  std::vector<uint32_t> missing = variable.missing_workers();
  bool proceed = settings_.sync.on_timeout == SyncTimeoutAction::proceed;
  Error error(
      ErrorCode::sync_timeout,
      fmt::format("step {} of variable '{}' on shard {} waited {:.1f} s for worker(s) {}{}", step,
                  variable.spec().name, settings_.id.value,
                  seconds_between(step_began_[id.value], now), fmt::join(missing, ", "),
                  proceed ? "; applied without them (their pushes of it are dropped)" : ""));
  ++timeouts_;
  actions_.count_error(error);
  log_warn("{}", error.what());
  if (!proceed) {
    actions_.fail_polls(id, step, error);
    step_began_[id.value] = now;  // fail the polls filed from now on after as long
    return;
  }
  actions_.complete_without_missing(id, step);
  completed_without_[id.value] = {step, std::move(missing)};
  step_began_.erase(id.value);
}

}  // namespace psched
