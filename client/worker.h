// SPDX-License-Identifier: Apache-2.0
// Worker: the worker side of psched inside one trainer process, without threads of its own.
// It owns the shard links, the transport, and the Scheduler and GradientPusher actors, all on
// one event loop (actors/runtime/actor.h), where they call each other directly. The threaded Client
// runs it on its loop thread; tests drive it on their own thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/shard/table_spec.h"
#include "actors/worker/gradient_pusher.h"
#include "actors/worker/scheduler.h"
#include "actors/worker/variable_handle.h"
#include "link/link_transport.h"
#include "link/shard_link.h"
#include "net/cluster_layout.h"

namespace psched {

struct WorkerOptions {
  WorkerId id;
  std::string token;
  SchedulerConfig scheduler;
};

class Worker : private kj::TaskSet::ErrorHandler {
 public:
  // Built on `loop`'s thread, where the links live. `links[i]` is shard i in config order.
  Worker(ActorLoop& loop, std::vector<kj::Own<ShardLink>> links, WorkerOptions options);
  ~Worker();

  // The promises below reject with kj::Exception whose description carries the psched error
  // code ("[code] message"; read it with from_kj_exception); checks made before a promise
  // exists throw psched::Error directly.
  //
  // Connects to every shard and checks that they describe the same cluster.
  kj::Promise<void> connect();
  // Registers the variable on the shards that placement gives it. `value` is the
  // trainer's parameter memory: its content is the initial value (the first registration of
  // a name wins) and fresh values are written into it; it stays alive while the worker does.
  // `compression`: how its gradients and fresh values travel.
  kj::Promise<VariableHandle> register_variable(VariableSpec spec, std::span<std::byte> value,
                                                bool use_server_optimizer,
                                                Compression compression = {});
  // Overwrites the variable's memory with the shards' current value; with `after`, once
  // `after`'s update is applied (sync: the job's; async: this worker's).
  kj::Promise<void> pull(VariableHandle handle, Step after = Step());
  // This worker is a process that starts: resolves with the step from which it takes part,
  // which every shard agreed on (sync: the largest any answered; async: the smallest).
  // After connect().
  kj::Promise<Step> join(Step at_least = Step(1));
  // Registrations, pulls and pushes whose connection is lost are sent again once the link
  // has reconnected (link/shard_link.h); they fail only when it gives up.

  // Pushes the whole gradient of `handle` for `step`; `done` runs (on the loop) when every
  // partition's fresh value is in the variable's memory. The caller keeps `gradient` alive
  // until then. Every method runs on the loop's thread.
  void push(VariableHandle handle, Step step, std::span<const std::byte> gradient,
            GradientPusher::PushDone done);

  // Embedding tables (actors/shard/row_table.h): every shard holds the rows row_shard() gives
  // it, so each call below goes to every shard, with the ids it holds (none, even).
  //
  // Registers table `spec` on every shard; its rows travel in `compression`'s push and pull
  // formats (none, bf16 or fp16), when a request's rows are at least min_bytes.
  kj::Promise<TableHandle> register_table(TableSpec spec, Compression compression = {});
  // This worker's step `step` of the table: `ids` (each once) with one gradient row each in
  // `gradients`, read before the call returns; resolves at every shard's receipt.
  kj::Promise<void> push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                              std::span<const std::byte> gradients);
  // The rows `ids` (duplicates allowed) into `out` (ids.size() rows, alive until the promise
  // resolves), once `after`'s update of them is applied (sync: the job's; async: this
  // worker's; Step(): at once). A `prefetch` (the rows of a step still to come) is scheduled
  // below every task that is not one: kPrefetchPriority above the table's priority.
  kj::Promise<void> pull_rows(TableHandle handle, Step after, std::span<const uint64_t> ids,
                              std::span<std::byte> out, bool prefetch = false);
  // What a prefetch adds to its table's priority (lower is more urgent): more than any
  // registration gives, so the current step's pushes and pulls go first.
  static constexpr int64_t kPrefetchPriority = int64_t{1} << 40;
  const TableSpec& table(TableHandle handle) const;
  // Work the worker's callers started and keep running on the loop (a push of rows whose
  // outcome they take by callback). Its failures are logged; callers catch their own.
  kj::TaskSet& tasks() { return tasks_; }

  // Valid after connect().
  const ClusterLayout& layout() const { return layout_; }
  Scheduler& scheduler() { return scheduler_; }
  GradientPusher& pusher() { return pusher_; }

 private:
  void taskFailed(kj::Exception&& exception) override;
  void check_layout(const ClusterLayout& layout, size_t link) const;
  const VariablePlan& plan(VariableHandle handle) const;
  // A registered table: its spec, placement key, each shard's id for it, and its formats.
  struct TablePlan {
    TableSpec spec;
    uint64_t key = 0;
    std::vector<VariableId> ids;  // by shard
    Compression compression;
    // sync: by shard, the newest step a pull of this worker's saw complete there.
    std::vector<Step> complete;
  };
  // `ids` by shard: each shard's ids (each once) and where each id's rows are in the caller's
  // order (an id given twice: both places).
  struct ShardRows {
    std::vector<uint64_t> ids;
    std::vector<std::vector<uint32_t>> at;
  };
  const TablePlan& table_plan(TableHandle handle) const;
  std::vector<ShardRows> group(const TablePlan& plan, std::span<const uint64_t> ids) const;
  // One shard's push of its rows of `step`, `rows` gathered from `gradients`.
  // It is queued once `gate` resolves.
  kj::Promise<void> push_shard_rows(const TablePlan& plan, size_t shard, Step step, ShardRows rows,
                                    std::span<const std::byte> gradients, kj::Promise<void> gate);
  kj::Promise<void> pull_shard_rows(TableHandle handle, size_t shard, Step after, ShardRows rows,
                                    std::span<std::byte> out, Priority priority);
  // Resolves once the table's last push so far was received or failed (at once: none).
  kj::Promise<void> last_push_received(TableHandle handle);
  // sync: resolves once `shard` completed step `step` - 1 of the table, which a shard must
  // before it takes step `step` (a pull of no rows, unless a pull already saw it). A worker
  // whose rows of `step` came early (a stale prefetch) or from other shards may be there first.
  kj::Promise<void> previous_step_complete(TableHandle handle, size_t shard, Step step);
  // Queues `request` with the scheduler as a task of `priority`, `memory` keeping what it
  // points to; resolves when it is finished (a push: received; a pull: landed).
  kj::Promise<void> schedule_rows(Priority priority, size_t shard, RowsRequest request,
                                  std::shared_ptr<const void> memory);
  // The scheduler's report of a finished task: a row task's, or the pusher's.
  void task_done(uint64_t task_id, std::exception_ptr error);
  // Row tasks' ids have this bit (the pusher's count up from 0).
  static constexpr uint64_t kRowTasks = uint64_t{1} << 63;

  WorkerOptions options_;
  std::vector<kj::Own<ShardLink>> links_;
  LinkTransport transport_;
  Scheduler scheduler_;
  GradientPusher pusher_;
  ClusterLayout layout_;
  std::vector<VariablePlan> plans_;  // index = handle
  std::vector<TablePlan> tables_;    // index = TableHandle
  uint64_t next_row_task_ = 0;
  std::unordered_map<uint64_t, kj::Own<kj::PromiseFulfiller<void>>> row_tasks_;  // by task id
  // By table: its last push, received or failed (never rejects), which its pulls wait for.
  std::unordered_map<uint32_t, kj::ForkedPromise<void>> last_push_;
  kj::TaskSet tasks_{*this};  // last: its tasks use the rest
};

}  // namespace psched
