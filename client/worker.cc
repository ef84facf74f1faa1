// SPDX-License-Identifier: Apache-2.0
#include "client/worker.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>
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

// Async mode: the smallest step any shard's variables have not completed, shards that host none
// (Step()) aside; 1 when no shard hosts any.
Step async_start(kj::ArrayPtr<const Step> steps) {
  std::optional<Step> least;
  for (Step s : steps)
    if (s != Step()) least = std::min(least.value_or(s), s);
  return least.value_or(Step(1));
}

}  // namespace

Worker::Worker(ActorLoop& loop, std::vector<kj::Own<ShardLink>> links, WorkerOptions options)
    : options_(std::move(options)),
      links_(std::move(links)),
      transport_(raw(links_)),
      scheduler_(loop, options_.scheduler.policy, options_.scheduler.credit_bytes, transport_,
                 [this](uint64_t task, std::exception_ptr error) { task_done(task, error); }),
      pusher_(scheduler_, options_.scheduler.partition_bytes),
      stepper_(scheduler_, static_cast<uint32_t>(links_.size())) {
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
    stepper_.set_map(layout_.slot_map);
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
      place_variable(spec.name, spec.elements(), bytes, layout_.slot_map, layout_.split_bytes);
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
        if (layout_.mode == Mode::async) return async_start(steps);
        auto [least, most] = std::minmax_element(steps.begin(), steps.end());
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
  const std::array<std::pair<std::string_view, WireFormat>, 2> formats{
      {{"push", compression.push}, {"pull", compression.pull}}};
  for (auto [direction, format] : formats)
    if (!carries_values(format))
      fail(ErrorCode::invalid_argument,
           "register of table '{}' rejected: its compression {} is {}, but rows travel as none, "
           "bf16 or fp16 (topk and onebit drop part of each gradient, a topk pull asks for "
           "deltas; a table takes none of them)",
           spec.name, direction, to_string(format));
  kj::Vector<kj::Promise<VariableId>> ids;
  for (auto& owned : links_) {
    ShardLink& link = *owned;
    ids.add(on_link(link, [&link, spec] { return link.register_table(spec); }));
  }
  return kj::joinPromises(ids.releaseAsArray())
      .then([this, spec = std::move(spec), compression](kj::Array<VariableId> ids) mutable {
        const TableHandle handle(tables_++);
        stepper_.add(handle, std::move(spec), {ids.begin(), ids.end()}, compression);
        return handle;
      });
}

std::pair<kj::Promise<void>, TableStepper::Done> Worker::settled_by_stepper() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto fulfiller = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
  return {kj::mv(paf.promise), [fulfiller](std::exception_ptr error) {
            if (error)
              (*fulfiller)->reject(to_kj_exception(error));
            else
              (*fulfiller)->fulfill();
          }};
}

kj::Promise<void> Worker::push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                                    std::span<const std::byte> gradients) {
  auto [promise, done] = settled_by_stepper();
  stepper_.push(handle, step, ids, gradients, std::move(done));
  return kj::mv(promise);
}

kj::Promise<void> Worker::pull_rows(TableHandle handle, Step after, std::span<const uint64_t> ids,
                                    std::span<std::byte> out, bool prefetch) {
  auto [promise, done] = settled_by_stepper();
  stepper_.pull(handle, after, ids, out, prefetch, std::move(done));
  return kj::mv(promise);
}

void Worker::task_done(uint64_t task_id, std::exception_ptr error) {
  if (!stepper_.task_done(task_id, error)) pusher_.task_done(task_id, error);
}

}  // namespace psched
