// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/gradient_pusher.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "common/error.h"
#include "compression/codec.h"
#include "compression/error_feedback.h"

namespace psched {

namespace {

// PSCHED_REQUIREs that the plan's parts cover [0, plan.elements) contiguously, in order.
void check_parts(const VariablePlan& plan) {
  uint64_t covered = 0;
  for (const PlacedPart& part : plan.parts) {
    PSCHED_REQUIRE(part.range.begin == covered, plan.name, part.range.begin, covered);
    PSCHED_REQUIRE(part.range.begin <= part.range.end, plan.name, part.range.begin, part.range.end);
    covered = part.range.end;
  }
  PSCHED_REQUIRE(covered == plan.elements, plan.name, covered, plan.elements);
}

}  // namespace

GradientPusher::GradientPusher(Scheduler& scheduler, uint64_t partition_bytes)
    : Actor(scheduler.loop()), scheduler_(scheduler), partition_bytes_(partition_bytes) {}

void GradientPusher::add_variable(VariableHandle handle, VariablePlan plan) {
  check_parts(plan);
  dispatch([this, handle, plan = std::move(plan)]() mutable {
    residuals_.erase(handle);  // what error feedback held back belongs to the plan replaced
    variables_.insert_or_assign(handle, std::move(plan));
  });
  forget_versions(handle);  // the memory may be another
}

void GradientPusher::push(VariableHandle handle, Step step, std::span<const std::byte> gradient,
                          PushDone done) {
  dispatch([this, handle, step, gradient, done = std::move(done)]() mutable {
    auto it = variables_.find(handle);
    if (it == variables_.end()) {
      done(std::make_exception_ptr(Error(
          ErrorCode::unknown_variable,
          fmt::format("push rejected: no variable with handle {} is registered", handle.value))));
      return;
    }
    if (tuner_) observe_step(step);
    const VariablePlan& plan = it->second;
    if (gradient.size() != plan.elements * element_bytes(plan.dtype)) {
      done(std::make_exception_ptr(
          Error(ErrorCode::shape_mismatch,
                fmt::format("push of variable '{}' rejected: gradient of {} bytes, expected {} ({} "
                            "elements of {})",
                            plan.name, gradient.size(), plan.elements * element_bytes(plan.dtype),
                            plan.elements, to_string(plan.dtype)))));
      return;
    }
    std::vector<PartitionTask> tasks;
    try {
      tasks = cut(plan, step, gradient.data(), partition_bytes_, 0);
    } catch (...) {
      done(std::current_exception());  // a broken precondition, reported to the caller
      return;
    }
    if (tasks.empty()) {
      done(nullptr);
      return;
    }
    compress(handle, plan, step, tasks);
    const uint64_t first_id = scheduler_.reserve_task_ids(tasks.size());
    for (PartitionTask& task : tasks) task.id += first_id;
    uint64_t push_id = next_push_id_++;
    pushes_.emplace(push_id, PendingPush{tasks.size(), nullptr, std::move(done)});
    for (const auto& task : tasks) push_of_task_.emplace(task.id, push_id);
    scheduler_.enqueue(std::move(tasks));
  });
}

void GradientPusher::compress(VariableHandle handle, const VariablePlan& plan, Step step,
                              std::vector<PartitionTask>& tasks) {
  const uint64_t variable_bytes = plan.elements * element_bytes(plan.dtype);
  const WireFormat format = plan.compression.push_at(step.value, variable_bytes);
  const WireFormat value_format = plan.compression.pull_for(variable_bytes);
  std::byte* residual = nullptr;
  if (needs_feedback(format)) {
    std::vector<std::byte>& owed = residuals_[handle];
    owed.resize(variable_bytes);  // zeros the first time
    residual = owed.data();
  }
  const bool deltas = plan.compression.deltas_at(step.value, variable_bytes);
  for (PartitionTask& task : tasks) {
    PartitionRequest& request = task.partition();
    request.value_format = value_format;
    if (deltas) ask_delta(handle, plan, step, request);
    if (format == WireFormat::none) continue;
    auto body = std::make_shared<std::vector<std::byte>>();
    const std::span<const std::byte> gradient = request.gradient;
    if (residual)
      encode_with_feedback(
          format, plan.dtype, gradient,
          {residual + request.range.begin * element_bytes(plan.dtype), gradient.size()},
          plan.compression.topk, *body, scratch_);
    else
      encode(format, plan.dtype, gradient, plan.compression.topk, *body);
    request.format = format;
    request.gradient = *body;
    task.keeps = std::move(body);
  }
}

void GradientPusher::ask_delta(VariableHandle handle, const VariablePlan& plan, Step step,
                               PartitionRequest& request) {
  const Compression& c = plan.compression;
  request.delta = {.version = &versions_[handle][{request.range.begin, request.range.end}],
                   .count = static_cast<uint32_t>(c.delta_count(request.range.size())),
                   .ring = c.ring,
                   .refresh = c.refresh_at(step.value)};
}

void GradientPusher::forget_versions(VariableHandle handle) {
  dispatch([this, handle] {
    for (auto& [range, version] : versions_[handle]) version = 0;
  });
}

void GradientPusher::set_partition_bytes(uint64_t bytes) {
  dispatch([this, bytes] { partition_bytes_ = bytes; });
}

void GradientPusher::enable_autotune(TuningPoint start, AutotunerOptions options) {
  dispatch([this, start, options] {
    tuner_.emplace(start, options);
    partition_bytes_ = tuner_->current().partition_bytes;
    scheduler_.set_credit(tuner_->current().credit_bytes);
  });
}

void GradientPusher::tuning(std::function<void(TuningState)> reply) {
  dispatch([this, reply = std::move(reply)] {
    TuningState state;
    if (tuner_) {
      state = {true,
               tuner_->current(),
               tuner_->converged(),
               tuner_->searches(),
               tuner_->tuned_seconds(),
               iterations_,
               converged_after_};
    }
    reply(state);
  });
}

void GradientPusher::observe_step(Step step) {
  std::optional<double> seconds = iteration_timer_.pushed(step, IterationTimer::Clock::now());
  if (!seconds) return;
  ++iterations_;
  bool was_converged = tuner_->converged();
  if (auto change = tuner_->observe(*seconds)) {
    partition_bytes_ = change->partition_bytes;
    scheduler_.set_credit(change->credit_bytes);
  }
  if (tuner_->converged() && !was_converged) converged_after_ = iterations_;
}

void GradientPusher::task_done(uint64_t task_id, std::exception_ptr error) {
  dispatch([this, task_id, error] {
    auto task = push_of_task_.find(task_id);
    if (task == push_of_task_.end()) return;  // not one of ours: another producer's task
    auto push = pushes_.find(task->second);
    push_of_task_.erase(task);
    PendingPush& pending = push->second;
    if (error && !pending.first_error) pending.first_error = error;
    if (--pending.tasks_left > 0) return;
    PushDone done = std::move(pending.done);
    std::exception_ptr first_error = pending.first_error;
    pushes_.erase(push);
    done(first_error);
  });
}

std::vector<PartitionTask> GradientPusher::cut(const VariablePlan& plan, Step step,
                                               const std::byte* gradient, uint64_t partition_bytes,
                                               uint64_t first_id) {
  check_parts(plan);
  std::vector<PartitionTask> tasks;
  if (plan.elements == 0) return tasks;
  PSCHED_REQUIRE(gradient != nullptr && plan.value != nullptr, plan.name);
  const uint64_t elem_bytes = element_bytes(plan.dtype);
  const uint64_t chunk = std::max<uint64_t>(1, partition_bytes / elem_bytes);
  for (const PlacedPart& part : plan.parts) {
    for (uint64_t begin = part.range.begin; begin < part.range.end; begin += chunk) {
      ElementRange range{begin, std::min(part.range.end, begin + chunk)};
      PartitionTask task{.id = first_id + tasks.size(),
                         .priority = plan.priority,
                         .shard = part.shard,
                         .request = PartitionRequest{
                             .variable = part.shard_variable,
                             .step = step,
                             .range = range,
                             .dtype = plan.dtype,
                             .gradient = {gradient + begin * elem_bytes, range.size() * elem_bytes},
                             .out = plan.value + begin * elem_bytes}};
      tasks.push_back(std::move(task));
    }
  }
  return tasks;
}

}  // namespace psched
