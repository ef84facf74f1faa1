// SPDX-License-Identifier: Apache-2.0
// psched's C++ client: the whole public API a trainer needs.
//
//   psched::Client client(psched::ClientOptions::from_config(config, psched::WorkerId(rank)));
//   auto w = client.register_variable({.name = "fc1/w", .shape = {784, 128}}, weights_bytes);
//   uint64_t first = client.start_step().value;       // 1, or the step of a job under way
//   client.pull(w, psched::Step(first - 1));          // the shards' values that step starts from
//   for (uint64_t s = first; ...; ++s) {
//     ... backward writes grad ...
//     client.push(w, psched::Step(s), grad_bytes);  // returns at once; scheduled by priority
//     client.wait(w, psched::Step(s));              // fresh weights are now in weights_bytes
//   }
//
// A Client owns one thread, which runs an event loop holding the shard connections and the
// worker's actors (actors/runtime/actor.h): a push crosses to it once, and a wait is woken once
// when the push is done. All methods may be called from any thread. Creating one tunes the
// process's malloc for large messages (common/malloc_tuning.h).
//
// This header includes neither KJ nor generated Cap'n Proto code, directly or through the
// headers it includes (client/client_header_check.cc fails the build if it does): what runs on
// the loop thread is in client.cc.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "actors/worker/autotuner.h"
#include "actors/worker/scheduler_report.h"
#include "actors/worker/variable_handle.h"
#include "common/histogram.h"
#include "config/deployment.h"
#include "net/cluster_layout.h"

namespace psched {

class StreamWrapper;  // link/stream_wrapper.h

class Completion;

// A pull of rows under way (Client::start_pull_rows). Copies share one pull.
class RowsPull {
 public:
  // Blocks until the rows are in the pull's `out`; rethrows its error (every call does).
  void wait() const;
  // Whether wait() would return (or throw) at once.
  bool ready() const;

 private:
  friend class Client;
  explicit RowsPull(std::shared_ptr<Completion> done) : done_(std::move(done)) {}
  std::shared_ptr<Completion> done_;
};

struct ClientOptions {
  std::vector<std::string> shards;  // "host:port" of every shard, in config order
  WorkerId worker;
  std::string token;
  SchedulerConfig scheduler;
  uint64_t max_message_bytes = 64 << 20;
  double reconnect_timeout_seconds = 60;  // a lost shard is retried this long (reconnect:)
  // Present: connect over TLS, trusting tls->ca_file (read when the client starts; net/tls.h).
  std::optional<TlsConfig> tls;
  // Optional: wraps each shard connection's stream on the client's loop thread (benchmarks
  // shape bandwidth with it). Shared by the clients given these options.
  std::shared_ptr<StreamWrapper> wrap_stream;
  // Pushes and polls go over a data stream beside each shard's RPC connection (framed, no
  // per-call RPC objects; net/data_frame.h); false: as RPC calls (the A/B baseline).
  bool data_stream = true;
  // How variables' gradients and fresh values travel unless register_variable says otherwise,
  // and tables' rows unless register_table does (as rows take it: Compression::for_rows).
  Compression compression;
  // The client is a trainer process that starts: it asks the shards from which step it takes
  // part (start_step(); a restarted worker rejoins a running job there). false: a client that
  // only reads (an evaluator), which must not take a trainer's place in a sync job.
  bool join = true;
  // The deployment file `shards` came from (from_config sets it for a file load_deployment
  // read; absolute): as a link opens a stream (connects, or reconnects) it reads the file again
  // when the file changed, and when shard i's entry differs from what the file said at first, it
  // goes there: a shard restarted at another address (on another node, the file edited to say
  // so; replace it whole, write then rename) is followed without restarting the trainer. The
  // shard that answers must be the same one (net/cluster_layout.h shard_change). Only the
  // addresses are taken; TLS and auth stay as at start. Empty: `shards`, always.
  std::filesystem::path deployment_file;

  // Shards, token, TLS, scheduler, limits, data path, compression and the deployment file.
  static ClientOptions from_config(const DeploymentConfig& config, WorkerId worker);
};

// A worker's figures for the operator view (client/worker_monitor.h); a copy.
struct WorkerStats {
  WorkerId worker;
  SchedulerStats scheduler;  // credit in use, queue depth by priority, tasks
  // Iteration time: between the first pushes of consecutive steps (any variable), measured
  // as the autotuner measures it (actors/worker/iteration_timer.h).
  Histogram iteration_seconds;
};

class Client {
 public:
  // Connects to every shard. Throws psched::Error (bad_token, disconnected, ...) on failure.
  // A connection lost later is re-opened for up to reconnect_timeout_seconds, and what was in
  // flight on it is sent again (link/shard_link.h): the trainer notices nothing but the delay.
  explicit Client(ClientOptions options);
  ~Client();  // waits for nothing: pushes still in flight are abandoned
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClusterLayout& layout() const;
  // The first step this worker pushes: 1 in a fresh job; in a job under way (a restarted
  // worker, or one that joins late), the step the shards agreed on. Its first pushes are of
  // start_step(), from the values pull(handle, start_step() - 1) gives (docs/reliability.md).
  // Step(1) when the options said not to join.
  Step start_step() const;

  // Registers a variable. `value` is the trainer's parameter memory: its content is the
  // initial value (the first registration of a name wins; call pull() to adopt it) and fresh
  // values are written into it. It must stay alive as long as the client.
  // With `use_server_optimizer`, spec.optimizer is ignored and the deployment's default used.
  // `compression`: how this variable's gradients and values travel; none given: the options'.
  VariableHandle register_variable(const VariableSpec& spec, std::span<std::byte> value,
                                   bool use_server_optimizer = false,
                                   std::optional<Compression> compression = std::nullopt);
  // Starts pushing the variable's whole gradient for `step` (1, 2, ...); returns at once.
  // `gradient` must stay alive and unchanged until wait(handle, step) returns.
  void push(VariableHandle handle, Step step, std::span<const std::byte> gradient);
  // Blocks until `step`'s fresh value is in the variable's memory; rethrows the push's error.
  void wait(VariableHandle handle, Step step);
  // Whether wait(handle, step) would return (or throw) at once; does not consume the push.
  bool ready(VariableHandle handle, Step step);
  // Blocks; overwrites the variable's memory with the shards' current value, with `after`
  // once `after`'s update is applied (sync: the job's step; async: this worker's).
  void pull(VariableHandle handle, Step after = Step());
  // Embedding tables, held row by row on the shards (docs/embeddings.md): the trainer holds
  // only the rows of the batch in hand.
  //
  // Registers table `spec` on every shard (the first registration of a name wins; the same
  // spec again is a no-op, another fails with spec_conflict). Its rows travel in
  // `compression`'s push and pull formats, each none, bf16 or fp16 (another is refused with
  // Error(invalid_argument) naming the table and the format); none given: the options'
  // (every variable's) as rows can take it (Compression::for_rows: a topk or onebit push goes
  // whole, a topk pull asks for pull_full). Either way a table smaller than min_bytes
  // (spec.bytes(): all its rows, not a request's) travels whole, as a small variable does.
  TableHandle register_table(const TableSpec& spec,
                             std::optional<Compression> compression = std::nullopt);
  // Starts pushing this worker's step `step` (1, 2, ...) of the table: `ids` (each once) with
  // one gradient row each in `gradients`; returns at once. Every step of every table is pushed,
  // with no ids when none was touched, or sync steps never close. Both spans must stay alive
  // until wait_rows(handle, step) returns.
  void push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                 std::span<const std::byte> gradients);
  // Blocks until every shard received the push of `step`; rethrows its refusal.
  void wait_rows(TableHandle handle, Step step);
  // Blocks; writes the rows `ids` (duplicates allowed) into `out`, one after another, once
  // `after`'s update of them is applied (sync: the job's; async: this worker's; Step(): now).
  void pull_rows(TableHandle handle, std::span<const uint64_t> ids, std::span<std::byte> out,
                 Step after = Step());
  // pull_rows started, returning at once: `ids` and `out` must stay alive until the pull's
  // wait() has returned (or ready() said true). A `prefetch` (the rows of a step still to
  // come, pulled while this one computes) is scheduled below every push and pull that is not
  // one, and its answer counts in the credit window like any pull's.
  RowsPull start_pull_rows(TableHandle handle, std::span<const uint64_t> ids,
                           std::span<std::byte> out, Step after = Step(), bool prefetch = false);
  // The registered table's spec, and the compression its rows travel in (register_table's
  // choice). Throw Error(invalid_argument) for a handle never registered.
  TableSpec table(TableHandle handle) const;
  Compression table_compression(TableHandle handle) const;

  // The scheduler's figures (bytes in flight, tasks started, ...).
  SchedulerStats scheduler_stats();
  // Calls `reply` with the worker's figures, on the client's loop thread (do not block there).
  void stats(std::function<void(WorkerStats)> reply);
  // The timelines of partitions finished since the last call (the newest
  // Scheduler::kMaxRecords of them); write them with write_chrome_trace (client/chrome_trace.h).
  std::vector<TaskRecord> take_records();
  // What the autotuner (scheduler.autotune) is doing; enabled = false when it is off.
  TuningState tuning();

 private:
  // The loop thread, the connector and Worker on it, and the pushes not yet waited for
  // (client.cc).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace psched
