// SPDX-License-Identifier: Apache-2.0
#include "client/worker.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "compression/codec.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

std::vector<ShardLink*> raw(std::vector<kj::Own<ShardLink>>& links) {
  std::vector<ShardLink*> out;
  for (auto& link : links) out.push_back(link.get());
  return out;
}

// Runs `check` inside a KJ continuation so that a psched::Error it throws keeps its code: KJ
// would turn a plain C++ exception into "std::exception: ..." and lose it.
template <typename Check>
void keeping_error_code(Check&& check) {
  try {
    check();
  } catch (const Error&) {
    kj::throwFatalException(to_kj_exception(std::current_exception()));
  }
}

// `call()` on `link`, and once more after the link reconnected when its connection was lost.
template <typename Call>
auto on_link(ShardLink& link, Call call) -> decltype(call()) {
  uint64_t epoch = link.epoch();
  return call().catch_([&link, epoch, call](kj::Exception&& e) mutable -> decltype(call()) {
    if (e.getType() != kj::Exception::Type::DISCONNECTED) return kj::mv(e);
    return link.recover(epoch).then([call]() mutable { return call(); });
  });
}

}  // namespace

Worker::Worker(ActorLoop& loop, std::vector<kj::Own<ShardLink>> links, WorkerOptions options)
    : options_(std::move(options)),
      links_(std::move(links)),
      transport_(raw(links_)),
      scheduler_(loop, options_.scheduler.policy, options_.scheduler.credit_bytes, transport_,
                 [this](uint64_t task, std::exception_ptr error) { task_done(task, error); }),
      pusher_(scheduler_, options_.scheduler.partition_bytes) {
  if (options_.scheduler.autotune)
    pusher_.enable_autotune({options_.scheduler.partition_bytes, options_.scheduler.credit_bytes});
}

Worker::~Worker() = default;

void Worker::taskFailed(kj::Exception&& exception) {
  log_error("worker {}: {}", options_.id.value, exception.getDescription().cStr());
}

kj::Promise<void> Worker::connect() {
  kj::Vector<kj::Promise<ClusterLayout>> answers;
  for (auto& link : links_) answers.add(link->connect(options_.id, options_.token));
  return kj::joinPromises(answers.releaseAsArray()).then([this](kj::Array<ClusterLayout> layouts) {
    keeping_error_code([&] {
      for (size_t i = 0; i < layouts.size(); ++i) check_layout(layouts[i], i);
      check_same_cluster({layouts.begin(), layouts.end()});
    });
    layout_ = layouts[0];
    // Sync mode frees credit when a push is received, long before every worker's push is in
    // and the value comes back; async holds it to the value, which follows the push at once.
    // Bounded mode's values may wait for a straggler as sync's do.
    scheduler_.set_free_credit_on_receipt(layout_.mode != Mode::async);
    transport_.set_receipt_first(layout_.mode != Mode::async);
  });
}

void Worker::check_layout(const ClusterLayout& layout, size_t link) const {
  if (layout.shard_index.value != link || layout.shard_addresses.size() != links_.size())
    fail(ErrorCode::bad_config,
         "shard {} of the client's list says it is shard {} of {}: the client's shard list "
         "differs from the deployment's",
         link, layout.shard_index.value, layout.shard_addresses.size());
  if (options_.scheduler.partition_bytes > layout.max_message_bytes)
    fail(ErrorCode::bad_config, "partition_bytes {} exceed the shards' message limit of {} bytes",
         options_.scheduler.partition_bytes, layout.max_message_bytes);
}

kj::Promise<VariableHandle> Worker::register_variable(VariableSpec spec, std::span<std::byte> value,
                                                      bool use_server_optimizer,
                                                      Compression compression) {
  check(compression);
  if (value.size() != spec.bytes())
    fail(ErrorCode::shape_mismatch,
         "register of variable '{}' rejected: memory of {} bytes for {} elements of {} ({} bytes)",
         spec.name, value.size(), spec.elements(), to_string(spec.dtype), spec.bytes());
  VariablePlan plan{spec.name, spec.priority, spec.dtype, spec.elements(),
                    {},        value.data(),  compression};
  size_t bytes = element_bytes(spec.dtype);
  auto parts =
      place_variable(spec.name, spec.elements(), bytes, links_.size(), layout_.split_bytes);
  kj::Vector<kj::Promise<VariableId>> ids;
  for (const ShardPart& part : parts) {
    // TODO(scale): upload the initial value in message-sized pieces.
    if (part.range.size() * bytes > layout_.max_message_bytes)
      fail(ErrorCode::message_too_large,
           "register of variable '{}' rejected: its part on shard {} holds {} bytes, over the "
           "message limit of {} (raise limits.max_message_bytes or add shards)",
           spec.name, part.shard.value, part.range.size() * bytes, layout_.max_message_bytes);
    auto initial = value.subspan(part.range.begin * bytes, part.range.size() * bytes);
    ShardLink& link = *links_[part.shard.value];
    ids.add(on_link(link, [&link, spec, use_server_optimizer, range = part.range, initial] {
      return link.register_part(spec, use_server_optimizer, range, initial);
    }));
  }
  return (kj::joinPromises(ids.releaseAsArray())
              .then([this, plan = std::move(plan), parts](kj::Array<VariableId> ids) mutable {
                for (size_t i = 0; i < parts.size(); ++i)
                  plan.parts.push_back({parts[i].shard, ids[i], parts[i].range});
                VariableHandle handle(static_cast<uint32_t>(plans_.size()));
                plans_.push_back(plan);
                pusher_.add_variable(handle, std::move(plan));
                return handle;
              }));
}

const VariablePlan& Worker::plan(VariableHandle handle) const {
  if (handle.value >= plans_.size())
    fail(ErrorCode::unknown_variable, "no variable with handle {} is registered", handle.value);
  return plans_[handle.value];
}

kj::Promise<Step> Worker::join(Step at_least) {
  kj::Vector<kj::Promise<Step>> answers;
  for (auto& link : links_)
    answers.add(on_link(*link, [&link = *link, at_least] { return link.join(at_least); }));
  return kj::joinPromises(answers.releaseAsArray())
      .then([this](kj::Array<Step> steps) -> kj::Promise<Step> {
        auto [least, most] = std::minmax_element(steps.begin(), steps.end());
        if (layout_.mode == Mode::async) return *least;
        if (*least == *most) return *most;
        return join(*most);  // a shard moved on: ask them all again from there
      });
}

kj::Promise<void> Worker::pull(VariableHandle handle, Step after) {
  const VariablePlan& p = plan(handle);
  size_t bytes = element_bytes(p.dtype);
  // In pieces of at most a partition, so any variable fits the message limit.
  uint64_t piece = std::max<uint64_t>(1, options_.scheduler.partition_bytes / bytes);
  kj::Vector<kj::Promise<void>> answers;
  for (const PlacedPart& part : p.parts) {
    for (uint64_t begin = part.range.begin; begin < part.range.end; begin += piece) {
      ElementRange r{begin, std::min(part.range.end, begin + piece)};
      ShardLink& link = *links_[part.shard.value];
      answers.add(
          on_link(link, [&link, id = part.shard_variable, r, out = p.value + r.begin * bytes,
                         n = r.size() * bytes, after] { return link.pull(id, r, out, n, after); }));
    }
  }
  // The memory now holds the shard's values, not the copy delta pulls left there.
  return kj::joinPromises(answers.releaseAsArray()).then([this, handle] {
    pusher_.forget_versions(handle);
  });
}

void Worker::push(VariableHandle handle, Step step, std::span<const std::byte> gradient,
                  GradientPusher::PushDone done) {
  pusher_.push(handle, step, gradient, std::move(done));
}

kj::Promise<TableHandle> Worker::register_table(TableSpec spec, Compression compression) {
  if (!carries_values(compression.push) || !carries_values(compression.pull))
    fail(ErrorCode::invalid_argument,
         "register of table '{}' rejected: rows travel as none, bf16 or fp16 (push {}, pull {})",
         spec.name, to_string(compression.push), to_string(compression.pull));
  kj::Vector<kj::Promise<VariableId>> ids;
  for (auto& owned : links_) {
    ShardLink& link = *owned;
    ids.add(on_link(link, [&link, spec] { return link.register_table(spec); }));
  }
  return kj::joinPromises(ids.releaseAsArray())
      .then([this, spec = std::move(spec), compression](kj::Array<VariableId> ids) mutable {
        const uint64_t key = table_key(spec.name);
        tables_.push_back({std::move(spec),
                           key,
                           {ids.begin(), ids.end()},
                           compression,
                           std::vector<Step>(ids.size())});
        return TableHandle(static_cast<uint32_t>(tables_.size() - 1));
      });
}

const Worker::TablePlan& Worker::table_plan(TableHandle handle) const {
  if (handle.value >= tables_.size())
    fail(ErrorCode::invalid_argument, "table handle {} was never registered", handle.value);
  return tables_[handle.value];
}

const TableSpec& Worker::table(TableHandle handle) const {
  return table_plan(handle).spec;
}

std::vector<Worker::ShardRows> Worker::group(const TablePlan& plan,
                                             std::span<const uint64_t> ids) const {
  std::vector<ShardRows> shards(links_.size());
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> seen;  // id -> shard, row
  for (uint32_t k = 0; k < ids.size(); ++k) {
    auto [it, fresh] = seen.try_emplace(ids[k]);
    if (fresh) {
      const uint32_t shard = row_shard(plan.key, ids[k], static_cast<uint32_t>(links_.size()));
      it->second = {shard, static_cast<uint32_t>(shards[shard].ids.size())};
      shards[shard].ids.push_back(ids[k]);
      shards[shard].at.emplace_back();
    }
    shards[it->second.first].at[it->second.second].push_back(k);
  }
  return shards;
}

kj::Promise<void> Worker::push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                                    std::span<const std::byte> gradients) {
  const TablePlan& plan = table_plan(handle);
  if (gradients.size() != ids.size() * plan.spec.row_bytes())
    fail(ErrorCode::shape_mismatch,
         "push of table '{}' rejected: {} bytes for {} rows of {} elements of {}", plan.spec.name,
         gradients.size(), ids.size(), plan.spec.dim, to_string(plan.spec.dtype));
  std::vector<ShardRows> shards = group(plan, ids);
  for (const ShardRows& rows : shards)
    for (const auto& at : rows.at)
      if (at.size() > 1)
        fail(ErrorCode::invalid_argument,
             "push of table '{}' rejected: id {} is given {} times (push each row once, its "
             "gradients summed)",
             plan.spec.name, ids[at[0]], at.size());
  // sync: each shard takes step `step` only once it completed the one before, which this
  // worker may not have seen yet; the gate waits for that after the previous push's receipts.
  auto received = last_push_received(handle).fork();
  kj::Vector<kj::Promise<void>> receipts;
  for (size_t shard = 0; shard < shards.size(); ++shard) {
    kj::Promise<void> gate = kj::READY_NOW;
    if (layout_.mode == Mode::sync && plan.complete[shard].value + 1 < step.value)
      gate = received.addBranch().then(
          [this, handle, shard, step] { return previous_step_complete(handle, shard, step); });
    receipts.add(
        push_shard_rows(plan, shard, step, std::move(shards[shard]), gradients, kj::mv(gate)));
  }
  // A pull waits for this push (pull_rows): forked, each branch rejecting as the push does.
  auto pushed = kj::joinPromises(receipts.releaseAsArray()).fork();
  last_push_.insert_or_assign(handle.value,
                              pushed.addBranch().catch_([](kj::Exception&&) {}).fork());
  return pushed.addBranch();
}

kj::Promise<void> Worker::push_shard_rows(const TablePlan& plan, size_t shard, Step step,
                                          ShardRows rows, std::span<const std::byte> gradients,
                                          kj::Promise<void> gate) {
  const uint64_t row_bytes = plan.spec.row_bytes();
  std::vector<std::byte> gathered(rows.ids.size() * row_bytes);
  for (size_t k = 0; k < rows.ids.size(); ++k)
    std::memcpy(gathered.data() + k * row_bytes, gradients.data() + rows.at[k][0] * row_bytes,
                row_bytes);
  WireFormat format =
      gathered.size() >= plan.compression.min_bytes ? plan.compression.push : WireFormat::none;
  if (format != WireFormat::none) {
    std::vector<std::byte> narrowed(
        encoded_bytes(format, plan.spec.dtype, gathered.size() / element_bytes(plan.spec.dtype)));
    narrow_values(format, plan.spec.dtype, gathered, narrowed);
    gathered = std::move(narrowed);
  }
  auto held = std::make_shared<std::pair<std::vector<uint64_t>, std::vector<std::byte>>>(
      std::move(rows.ids), std::move(gathered));
  RowsRequest request{.table = plan.ids[shard],
                      .step = step,
                      .ids = held->first,
                      .dtype = plan.spec.dtype,
                      .gradient = held->second,
                      .format = format,
                      .push = true};
  return gate.then([this, priority = plan.spec.priority, shard, request, held] {
    return schedule_rows(priority, shard, request, held);
  });
}

kj::Promise<void> Worker::last_push_received(TableHandle handle) {
  auto it = last_push_.find(handle.value);
  return it == last_push_.end() ? kj::Promise<void>(kj::READY_NOW) : it->second.addBranch();
}

kj::Promise<void> Worker::previous_step_complete(TableHandle handle, size_t shard, Step step) {
  const TablePlan& plan = table_plan(handle);
  if (plan.complete[shard].value + 1 >= step.value) return kj::READY_NOW;
  // A pull of no rows waits for the table's step on the shard.
  return pull_shard_rows(handle, shard, Step(step.value - 1), ShardRows{}, {}, plan.spec.priority);
}

kj::Promise<void> Worker::schedule_rows(Priority priority, size_t shard, RowsRequest request,
                                        std::shared_ptr<const void> memory) {
  PartitionTask task{.id = kRowTasks | next_row_task_++,
                     .priority = priority,
                     .shard = ShardId(static_cast<uint32_t>(shard)),
                     .request = {.variable = request.table,
                                 .step = request.step,
                                 .range = {0, request.ids.size()},
                                 .dtype = request.dtype,
                                 .format = request.format,
                                 .value_format = request.value_format},
                     .rows = request,
                     .rows_memory = std::move(memory)};
  auto done = kj::newPromiseAndFulfiller<void>();
  row_tasks_.emplace(task.id, kj::mv(done.fulfiller));
  std::vector<PartitionTask> tasks;
  tasks.push_back(std::move(task));
  scheduler_.enqueue(std::move(tasks));
  return kj::mv(done.promise);
}

void Worker::task_done(uint64_t task_id, std::exception_ptr error) {
  if ((task_id & kRowTasks) == 0) return pusher_.task_done(task_id, error);
  auto it = row_tasks_.find(task_id);
  if (it == row_tasks_.end()) return;
  kj::Own<kj::PromiseFulfiller<void>> done = kj::mv(it->second);
  row_tasks_.erase(it);
  if (error)
    done->reject(to_kj_exception(error));
  else
    done->fulfill();
}

kj::Promise<void> Worker::pull_rows(TableHandle handle, Step after, std::span<const uint64_t> ids,
                                    std::span<std::byte> out, bool prefetch) {
  const TablePlan& plan = table_plan(handle);
  if (out.size() != ids.size() * plan.spec.row_bytes())
    fail(ErrorCode::shape_mismatch,
         "pull of table '{}' rejected: room of {} bytes for {} rows of {} elements of {}",
         plan.spec.name, out.size(), ids.size(), plan.spec.dim, to_string(plan.spec.dtype));
  auto shards = std::make_shared<std::vector<ShardRows>>(group(plan, ids));
  // After this worker's last push of the table is received: the pull then waits for no push of
  // this worker's queued behind it, so it cannot hold the credit that push needs.
  kj::Promise<void> pushed = last_push_received(handle);
  const Priority priority(plan.spec.priority.value + (prefetch ? kPrefetchPriority : 0));
  return pushed.then([this, handle, after, shards, out, priority] {
    kj::Vector<kj::Promise<void>> answers;
    for (size_t shard = 0; shard < shards->size(); ++shard)
      if (!(*shards)[shard].ids.empty())
        answers.add(
            pull_shard_rows(handle, shard, after, std::move((*shards)[shard]), out, priority));
    return kj::joinPromises(answers.releaseAsArray());
  });
}

kj::Promise<void> Worker::pull_shard_rows(TableHandle handle, size_t shard, Step after,
                                          ShardRows rows, std::span<std::byte> out,
                                          Priority priority) {
  const TablePlan& plan = table_plan(handle);
  const uint64_t row_bytes = plan.spec.row_bytes();
  std::vector<std::byte> landing(rows.ids.size() * row_bytes);
  auto held = std::make_shared<std::pair<ShardRows, std::vector<std::byte>>>(std::move(rows),
                                                                             std::move(landing));
  const WireFormat format =
      held->second.size() >= plan.compression.min_bytes ? plan.compression.pull : WireFormat::none;
  RowsRequest request{.table = plan.ids[shard],
                      .step = after,
                      .ids = held->first.ids,
                      .dtype = plan.spec.dtype,
                      .out = held->second.data(),
                      .elements = held->first.ids.size() * plan.spec.dim,
                      .value_format = format};
  return schedule_rows(priority, shard, request, held)
      .then([this, handle, shard, after, held, out, row_bytes] {
        // sync: the answer means the job completed `after` there.
        Step& complete = tables_[handle.value].complete[shard];
        if (layout_.mode == Mode::sync && after.value > complete.value) complete = after;
        const auto& [rows, landed] = *held;
        for (size_t k = 0; k < rows.ids.size(); ++k)
          for (uint32_t at : rows.at[k])
            std::memcpy(out.data() + at * row_bytes, landed.data() + k * row_bytes, row_bytes);
      });
}

}  // namespace psched
