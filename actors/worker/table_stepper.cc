// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/table_stepper.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/check.h"
#include "common/error.h"
#include "compression/codec.h"

namespace psched {
namespace {

// What a push task keeps alive until it is finished: its ids and rows.
struct PushedRows {
  std::vector<uint64_t> ids;
  std::vector<std::byte> rows;
};

// What a pull task keeps alive until it is finished: its ids and where each row lands.
struct PulledRows {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> at;
};

// Whether `rows` are consecutive: then they land whole, straight from the answer.
bool consecutive(const std::vector<uint32_t>& rows) {
  for (size_t k = 1; k < rows.size(); ++k)
    if (rows[k] != rows[0] + k) return false;
  return true;
}

}  // namespace

TableStepper::TableStepper(Scheduler& scheduler, uint32_t shards)
    : scheduler_(scheduler), shards_(shards) {
  PSCHED_REQUIRE(shards > 0, shards);
}

void TableStepper::set_map(SlotMap map) {
  PSCHED_REQUIRE(map.shards() == shards_, map.shards(), shards_);
  map_ = std::move(map);
}

void TableStepper::add(TableHandle handle, TableSpec spec, std::vector<VariableId> ids,
                       Compression compression) {
  PSCHED_REQUIRE(ids.size() == shards_ && !map_.empty(), ids.size(), shards_, map_.shards());
  PSCHED_REQUIRE(carries_values(compression.push) && carries_values(compression.pull),
                 to_string(compression.push), to_string(compression.pull));
  Table table{.key = table_key(spec.name),
              .ids = std::move(ids),
              .compression = compression,
              .pushing = std::vector<bool>(shards_),
              .queued = std::vector<std::deque<PartitionTask>>(shards_)};
  table.spec = std::move(spec);
  tables_.insert_or_assign(handle.value, std::move(table));
}

TableStepper::Table& TableStepper::table(TableHandle handle) {
  auto it = tables_.find(handle.value);
  if (it == tables_.end())
    fail(ErrorCode::invalid_argument, "table handle {} was never registered", handle.value);
  return it->second;
}

const TableSpec& TableStepper::spec(TableHandle handle) const {
  return const_cast<TableStepper*>(this)->table(handle).spec;
}

std::vector<std::vector<uint32_t>> TableStepper::by_shard(uint64_t key,
                                                          std::span<const uint64_t> ids,
                                                          const SlotMap& map) {
  std::vector<std::vector<uint32_t>> out(map.shards());
  for (uint32_t k = 0; k < ids.size(); ++k) out[row_shard(key, ids[k], map)].push_back(k);
  return out;
}

uint64_t TableStepper::begin_call(uint32_t tasks, Done done) {
  const uint64_t call = next_call_++;
  calls_.emplace(call, Call{tasks, nullptr, std::move(done)});
  return call;
}

void TableStepper::push(TableHandle handle, Step step, std::span<const uint64_t> ids,
                        std::span<const std::byte> gradients, Done done) {
  Table& t = table(handle);
  if (gradients.size() != ids.size() * t.spec.row_bytes())
    fail(ErrorCode::shape_mismatch,
         "push of table '{}' rejected: {} bytes for {} rows of {} elements of {}", t.spec.name,
         gradients.size(), ids.size(), t.spec.dim, to_string(t.spec.dtype));
  const auto rows = by_shard(t.key, ids, map_);
  std::vector<PartitionTask> tasks;
  for (uint32_t shard = 0; shard < shards_; ++shard)
    tasks.push_back(push_task(t, shard, step, ids, gradients, rows[shard]));
  const uint64_t call = begin_call(shards_, std::move(done));
  push_of_call_.emplace(call, PushCall{handle, ++t.pushes});
  schedule(handle, call, true, std::move(tasks));
}

PartitionTask TableStepper::push_task(const Table& table, uint32_t shard, Step step,
                                      std::span<const uint64_t> ids,
                                      std::span<const std::byte> gradients,
                                      const std::vector<uint32_t>& rows) const {
  const uint64_t row_bytes = table.spec.row_bytes();
  const WireFormat format = table.compression.push_at(step.value, table.spec.bytes());
  const uint64_t wire_row = encoded_bytes(format, table.spec.dtype, table.spec.dim);
  auto kept = std::make_shared<PushedRows>();
  kept->ids.reserve(rows.size());
  kept->rows.resize(rows.size() * wire_row);
  for (size_t k = 0; k < rows.size(); ++k) {
    kept->ids.push_back(ids[rows[k]]);
    // Each row straight from the caller's gradients into the request, narrowed on the way.
    narrow_values(format, table.spec.dtype, gradients.subspan(rows[k] * row_bytes, row_bytes),
                  std::span(kept->rows).subspan(k * wire_row, wire_row));
  }
  RowsRequest request{.table = table.ids[shard],
                      .step = step,
                      .ids = kept->ids,
                      .dtype = table.spec.dtype,
                      .dim = table.spec.dim,
                      .gradient = kept->rows,
                      .format = format,
                      .push = true};
  return {.priority = table.spec.priority,
          .shard = ShardId(shard),
          .request = request,
          .keeps = std::move(kept)};
}

void TableStepper::pull(TableHandle handle, Step after, std::span<const uint64_t> ids,
                        std::span<std::byte> out, bool prefetch, Done done) {
  Table& t = table(handle);
  if (out.size() != ids.size() * t.spec.row_bytes())
    fail(ErrorCode::shape_mismatch,
         "pull of table '{}' rejected: room of {} bytes for {} rows of {} elements of {}",
         t.spec.name, out.size(), ids.size(), t.spec.dim, to_string(t.spec.dtype));
  const Priority priority(t.spec.priority.value + (prefetch ? kPrefetchPriority : 0));
  auto rows = by_shard(t.key, ids, map_);
  std::vector<PartitionTask> tasks;
  for (uint32_t shard = 0; shard < shards_; ++shard)
    if (!rows[shard].empty())
      tasks.push_back(pull_task(t, shard, after, ids, out, std::move(rows[shard]), priority));
  if (tasks.empty()) return done(nullptr);
  const uint64_t call = begin_call(static_cast<uint32_t>(tasks.size()), std::move(done));
  auto start = [this, handle, call, tasks = std::move(tasks)]() mutable {
    schedule(handle, call, false, std::move(tasks));
  };
  // After the pushes made so far were received: it then waits for no push queued behind it.
  if (t.received == t.pushes) return start();
  t.pulls.emplace_back(t.pushes, std::move(start));
}

PartitionTask TableStepper::pull_task(const Table& table, uint32_t shard, Step after,
                                      std::span<const uint64_t> ids, std::span<std::byte> out,
                                      std::vector<uint32_t> rows, Priority priority) const {
  const uint64_t row_bytes = table.spec.row_bytes();
  auto kept = std::make_shared<PulledRows>();
  kept->ids.reserve(rows.size());
  for (uint32_t k : rows) kept->ids.push_back(ids[k]);
  RowsRequest request{.table = table.ids[shard],
                      .step = after,
                      .ids = kept->ids,
                      .dtype = table.spec.dtype,
                      .dim = table.spec.dim};
  request.value_format = table.compression.pull_for(table.spec.bytes());
  if (consecutive(rows)) {  // in one piece of `out`: the answer lands there whole
    request.out = out.data() + uint64_t{rows[0]} * row_bytes;
  } else {
    kept->at = std::move(rows);
    request.out = out.data();
    request.rows_at = kept->at;
  }
  return {
      .priority = priority, .shard = ShardId(shard), .request = request, .keeps = std::move(kept)};
}

void TableStepper::schedule(TableHandle handle, uint64_t call, bool push,
                            std::vector<PartitionTask> tasks) {
  const uint64_t first = scheduler_.reserve_task_ids(tasks.size());
  std::vector<PartitionTask> now;
  Table& t = table(handle);
  for (size_t k = 0; k < tasks.size(); ++k) {
    PartitionTask& task = tasks[k];
    task.id = first + k;
    const uint32_t shard = task.shard.value;
    tasks_.emplace(task.id, TaskOf{handle, call, shard, push});
    if (push && t.pushing[shard]) {  // after this worker's push before it, on that shard
      t.queued[shard].push_back(std::move(task));
      continue;
    }
    if (push) t.pushing[shard] = true;
    now.push_back(std::move(task));
  }
  if (!now.empty()) scheduler_.enqueue(std::move(now));
}

bool TableStepper::task_done(uint64_t task_id, std::exception_ptr error) {
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return false;
  const TaskOf of = it->second;
  tasks_.erase(it);
  if (of.push) next_push(of.table, of.shard);
  end_task(of.call, error);
  return true;
}

void TableStepper::next_push(TableHandle handle, uint32_t shard) {
  Table& t = table(handle);
  std::deque<PartitionTask>& queued = t.queued[shard];
  if (queued.empty()) {
    t.pushing[shard] = false;
    return;
  }
  std::vector<PartitionTask> next;
  next.push_back(std::move(queued.front()));
  queued.pop_front();
  scheduler_.enqueue(std::move(next));
}

void TableStepper::end_task(uint64_t call, std::exception_ptr error) {
  auto it = calls_.find(call);
  PSCHED_REQUIRE(it != calls_.end(), call);
  Call& c = it->second;
  if (error && !c.first_error) c.first_error = error;
  if (--c.tasks_left > 0) return;
  Done done = std::move(c.done);
  std::exception_ptr first_error = c.first_error;
  calls_.erase(it);
  if (auto push = push_of_call_.find(call); push != push_of_call_.end()) {
    const PushCall received = push->second;
    push_of_call_.erase(push);
    pushed(received.table, received.number);
  }
  done(first_error);
}

void TableStepper::pushed(TableHandle handle, uint64_t number) {
  Table& t = table(handle);
  t.received = number;
  while (!t.pulls.empty() && t.pulls.front().first <= t.received) {
    auto start = std::move(t.pulls.front().second);
    t.pulls.pop_front();
    start();
  }
}

}  // namespace psched
