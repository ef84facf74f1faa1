// SPDX-License-Identifier: Apache-2.0
// Worker: the worker side of psched inside one trainer process, without threads of its own.
// It owns the shard links, the transport, and the Scheduler with the GradientPusher (dense
// variables) and the TableStepper (embedding tables) that queue tasks on it, all on one event
// loop (actors/runtime/actor.h), where they call each other directly. The threaded Client
// runs it on its loop thread; tests drive it on their own thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "actors/shard/table_spec.h"
#include "actors/worker/gradient_pusher.h"
#include "actors/worker/scheduler.h"
#include "actors/worker/table_stepper.h"
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

  // Embedding tables (actors/shard/row_table.h), stepped by the TableStepper
  // (actors/worker/table_stepper.h): every shard holds the rows row_shard() gives it.
  //
  // Registers table `spec` on every shard; its rows travel in `compression`'s push and pull
  // formats when the table is at least min_bytes (TableStepper::add). A format that is not
  // none, bf16 or fp16 is refused with Error(invalid_argument) naming the table, the direction
  // and the format.
  kj::Promise<TableHandle> register_table(TableSpec spec, Compression compression = {});
  // This worker's step `step` of the table: `ids` (each once) with one gradient row each in
  // `gradients`, read before the call returns; resolves at every shard's receipt
  // (TableStepper::push).
  kj::Promise<void> push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                              std::span<const std::byte> gradients);
  // The rows `ids` (repeats allowed) into `out` (ids.size() rows, alive until the promise
  // resolves), once `after`'s update of them is applied (sync: the job's; async: this
  // worker's; Step(): at once); a `prefetch` below every task that is not one
  // (TableStepper::pull).
  kj::Promise<void> pull_rows(TableHandle handle, Step after, std::span<const uint64_t> ids,
                              std::span<std::byte> out, bool prefetch = false);
  const TableSpec& table(TableHandle handle) const { return stepper_.spec(handle); }
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
  // The scheduler's report of a finished task, to the stepper or the pusher that queued it.
  void task_done(uint64_t task_id, std::exception_ptr error);
  // A promise and the stepper's Done that settles it, on the loop.
  static std::pair<kj::Promise<void>, TableStepper::Done> settled_by_stepper();

  WorkerOptions options_;
  std::vector<kj::Own<ShardLink>> links_;
  LinkTransport transport_;
  Scheduler scheduler_;
  GradientPusher pusher_;
  TableStepper stepper_;
  ClusterLayout layout_;
  std::vector<VariablePlan> plans_;  // index = handle
  uint32_t tables_ = 0;              // registered: the next TableHandle
  kj::TaskSet tasks_{*this};         // last: its tasks use the rest
};

}  // namespace psched
