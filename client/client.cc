// SPDX-License-Identifier: Apache-2.0
#include "client/client.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include <kj/async-io.h>

#include "actors/runtime/loop_thread.h"
#include "actors/worker/iteration_timer.h"
#include "client/worker.h"
#include "common/completion.h"
#include "common/error.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "config/deployment.h"
#include "link/shard_connector.h"
#include "link/stream_wrapper.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// How long a trainer's wait spins before it sleeps (after a short wait; see WaitSpin): a small
// partition's push and answer on a fast link come back within it (measured in
// docs/benchmarks.md, "A waiter that spins").
constexpr std::chrono::microseconds kWaitSpin{50};

}  // namespace

ClientOptions ClientOptions::from_config(const DeploymentConfig& config, WorkerId worker) {
  ClientOptions options;
  for (const ShardConfig& shard : config.shards) options.shards.push_back(shard.listen.to_string());
  options.worker = worker;
  options.token = config.auth_token;
  options.tls = config.tls;
  options.scheduler = config.scheduler;
  options.max_message_bytes = config.limits.max_message_bytes;
  options.reconnect_timeout_seconds = config.reconnect.timeout_seconds;
  options.data_stream = config.data_path == DataPathKind::stream;
  options.compression = config.compression;
  options.deployment_file = config.file;
  return options;
}

struct Client::Impl {
  // Connects on the loop thread; throws what start() rejects with.
  explicit Impl(ClientOptions options);
  ~Impl();

  // On the loop thread: opens the links, connects the worker; resolves with the layout.
  kj::Promise<ClusterLayout> start(kj::AsyncIoContext& io);
  // On the loop thread, as a link to shard `i` opens a stream: its address in the deployment
  // file now (ClientOptions::deployment_file), else the one it had.
  std::string shard_address(size_t i);
  // The answer `ask(reply)` gives on the loop thread, where `ask` runs; blocks the caller.
  template <typename T, typename Ask>
  T ask_loop(Ask ask);
  using PendingPushes = std::map<std::pair<uint32_t, Step>, std::shared_ptr<Completion>>;
  // Pushes of variables (`pushes`) and of tables (`row_pushes`), `kind` naming which in errors.
  // Caller holds pushes_mutex for each.
  // A new push of (handle, step); throws Error(stale_step) when one is in flight.
  std::shared_ptr<Completion> file_push(PendingPushes& pending, const char* kind, uint32_t handle,
                                        Step step);
  // The push of (handle, step); throws Error(invalid_argument) when there is none.
  PendingPushes::iterator find_push(PendingPushes& pending, const char* kind, uint32_t handle,
                                    Step step);
  // The push of (handle, step), no longer pending: what a wait waits on.
  std::shared_ptr<Completion> take_push(PendingPushes& pending, const char* kind, uint32_t handle,
                                        Step step);
  // On the loop thread: runs the worker's call `start` and sets `done` with its outcome
  // (a throw from `start` included), the promise kept in the worker's tasks.
  template <typename Start>
  void settle(const std::shared_ptr<Completion>& done, Start start);
  // Drops the worker, then the connector, on the loop thread.
  void stop();
  // A copy of the registered table `handle`'s spec and compression; throws
  // Error(invalid_argument) for a handle never registered.
  std::pair<TableSpec, Compression> table(TableHandle handle) const;

  ClientOptions options;
  LoopThread thread{"psched-client"};
  // Built, used and destroyed on the loop thread (the connector outlives the links):
  std::unique_ptr<ShardConnector> connector;
  std::unique_ptr<Worker> worker;
  std::vector<ShardLink*> named;  // the worker's links, by shard: shard_address() renames them
  // The deployment file as shard_address() read it: the addresses it gave at first, and now,
  // and when it last changed (re-read only then).
  bool file_read = false;
  std::vector<std::string> file_said, file_now;
  FileVersion file_version{};
  ClusterLayout layout;
  Step start_step{1};

  mutable std::mutex pushes_mutex;
  // Guarded by pushes_mutex:
  PendingPushes pushes;
  PendingPushes row_pushes;  // by table handle and step
  // By handle: each table's spec and the compression its rows travel in.
  std::vector<std::pair<TableSpec, Compression>> tables;
  IterationTimer iteration_timer;
  Histogram iteration_seconds;
  WaitSpin wait_spin{kWaitSpin};  // the trainer's waits
};

Client::Impl::Impl(ClientOptions options_in) : options(std::move(options_in)) {
  tune_malloc_for_large_messages();
  try {
    layout = thread.call([this](kj::AsyncIoContext& io) { return start(io); });
    if (options.join)
      start_step = thread.call([this](kj::AsyncIoContext&) { return worker->join(); });
  } catch (...) {
    stop();
    throw;
  }
}

Client::Impl::~Impl() {
  stop();
}

void Client::Impl::stop() {
  thread.call([this](kj::AsyncIoContext&) {
    worker.reset();
    connector.reset();
  });
}

kj::Promise<ClusterLayout> Client::Impl::start(kj::AsyncIoContext& io) {
  connector = std::make_unique<ShardConnector>(io.provider->getNetwork(), options.tls);
  StreamWrap wrap;
  const bool plain_sockets = !options.tls && !options.wrap_stream;
  if (options.wrap_stream)
    wrap = [wrapper = options.wrap_stream, &timer = io.provider->getTimer()](
               kj::Own<kj::AsyncIoStream> stream) { return wrapper->wrap(kj::mv(stream), timer); };
  ReconnectPolicy policy{.timer = &io.provider->getTimer()};
  policy.timeout = static_cast<int64_t>(options.reconnect_timeout_seconds * 1e3) * kj::MILLISECONDS;
  std::vector<kj::Own<ShardLink>> links;
  for (size_t i = 0; i < options.shards.size(); ++i) {
    const std::string& address = options.shards[i];
    StreamOpener open = [this, i, wrap] { return connector->open(shard_address(i), wrap); };
    links.push_back(kj::heap<ShardLink>(address, std::move(open), options.max_message_bytes, policy,
                                        options.data_stream, plain_sockets));
    named.push_back(links.back().get());
  }
  WorkerOptions worker_options{options.worker, options.token, options.scheduler};
  worker = std::make_unique<Worker>(thread.loop(), kj::mv(links), worker_options);
  return worker->connect().then([this] { return worker->layout(); });
}

std::string Client::Impl::shard_address(size_t i) {
  std::string& known = options.shards[i];
  if (options.deployment_file.empty()) return known;
  try {
    // Parsed again only when the file changed (an outage retries every few hundred ms).
    const auto& file = options.deployment_file;
    const FileVersion version = psched::file_version(file);
    if (!file_read || !(version == file_version)) {
      const DeploymentConfig now = load_deployment(file);
      std::vector<std::string> addresses;
      for (const ShardConfig& shard : now.shards) addresses.push_back(shard.listen.to_string());
      if (!file_read) file_said = addresses;  // at start: `shards` (perhaps another) stays
      file_now = std::move(addresses);
      file_read = true;
      file_version = version;
    }
    // Followed when the file's own entry changed since it was first read, so that a caller's
    // `shards` (a proxy's) stays until the shard moves.
    if (i < file_now.size() && i < file_said.size() && file_now[i] != file_said[i]) {
      log_info("worker {}: shard {} is now at {} ({}), no longer at {}", options.worker.value, i,
               file_now[i], file.string(), known);
      known = file_said[i] = file_now[i];
      named[i]->set_address(known);
    }
  } catch (const std::exception& e) {
    log_warn("worker {}: shard {} stays at {}: {} cannot be read again: {}", options.worker.value,
             i, known, options.deployment_file.string(), e.what());
  }
  return known;
}

template <typename T, typename Ask>
T Client::Impl::ask_loop(Ask ask) {
  return thread.call([ask = std::move(ask)](kj::AsyncIoContext&) mutable {
    auto [promise, f] = reply_promise<T>();
    ask([f = f](T v) { (*f)->fulfill(std::move(v)); });
    return kj::mv(promise);
  });
}

std::shared_ptr<Completion> Client::Impl::file_push(PendingPushes& pending, const char* kind,
                                                    uint32_t handle, Step step) {
  auto done = std::make_shared<Completion>();
  if (!pending.try_emplace({handle, step}, done).second)
    fail(ErrorCode::stale_step, "push of {} handle {} step {} is already in flight", kind, handle,
         step);
  return done;
}

Client::Impl::PendingPushes::iterator Client::Impl::find_push(PendingPushes& pending,
                                                              const char* kind, uint32_t handle,
                                                              Step step) {
  auto it = pending.find({handle, step});
  if (it == pending.end())
    fail(ErrorCode::invalid_argument,
         "{} handle {} step {}: no such push (never pushed, or already waited for)", kind, handle,
         step);
  return it;
}

std::shared_ptr<Completion> Client::Impl::take_push(PendingPushes& pending, const char* kind,
                                                    uint32_t handle, Step step) {
  auto it = find_push(pending, kind, handle, step);
  std::shared_ptr<Completion> done = std::move(it->second);
  pending.erase(it);
  return done;
}

template <typename Start>
void Client::Impl::settle(const std::shared_ptr<Completion>& done, Start start) {
  try {
    // Dropped unsettled (the client closes): the waiter learns it rather than waiting forever.
    auto dropped = kj::defer([done] {
      if (!done->ready())
        done->set(std::make_exception_ptr(
            Error(ErrorCode::disconnected, "the client closed before the request finished")));
    });
    worker->tasks().add(start()
                            .then([done] { done->set(nullptr); },
                                  [done](kj::Exception&& e) {
                                    done->set(std::make_exception_ptr(from_kj_exception(e)));
                                  })
                            .attach(kj::mv(dropped)));
  } catch (...) {
    done->set(std::current_exception());
  }
}

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Client::~Client() = default;

const ClusterLayout& Client::layout() const {
  return impl_->layout;
}

VariableHandle Client::register_variable(const VariableSpec& spec, std::span<std::byte> value,
                                         bool use_server_optimizer,
                                         std::optional<Compression> compression) {
  Compression chosen = compression.value_or(impl_->options.compression);
  return impl_->thread.call([this, spec, value, use_server_optimizer, chosen](kj::AsyncIoContext&) {
    return impl_->worker->register_variable(spec, value, use_server_optimizer, chosen);
  });
}

Step Client::start_step() const {
  return impl_->start_step;
}

void Client::pull(VariableHandle handle, Step after) {
  impl_->thread.call(
      [this, handle, after](kj::AsyncIoContext&) { return impl_->worker->pull(handle, after); });
}

void Client::push(VariableHandle handle, Step step, std::span<const std::byte> gradient) {
  std::shared_ptr<Completion> done;
  {
    std::lock_guard lock(impl_->pushes_mutex);
    done = impl_->file_push(impl_->pushes, "variable", handle.value, step);
    if (auto seconds = impl_->iteration_timer.pushed(step, IterationTimer::Clock::now()))
      impl_->iteration_seconds.observe(*seconds);
  }
  // The one hop of a push; its `done` wakes the trainer's wait once.
  impl_->thread.loop().post([this, handle, step, gradient, done] {
    impl_->worker->push(handle, step, gradient,
                        [done](std::exception_ptr error) { done->set(std::move(error)); });
  });
}

void Client::wait(VariableHandle handle, Step step) {
  std::shared_ptr<Completion> done;
  {
    std::lock_guard lock(impl_->pushes_mutex);
    done = impl_->take_push(impl_->pushes, "variable", handle.value, step);
  }
  done->wait(impl_->wait_spin);
}

bool Client::ready(VariableHandle handle, Step step) {
  std::lock_guard lock(impl_->pushes_mutex);
  return impl_->find_push(impl_->pushes, "variable", handle.value, step)->second->ready();
}

TableHandle Client::register_table(const TableSpec& spec, std::optional<Compression> compression) {
  // The table's own setting, else the options' (every variable's) as rows can take it.
  const Compression chosen = compression ? *compression : impl_->options.compression.for_rows();
  TableHandle handle = impl_->thread.call([this, spec, chosen](kj::AsyncIoContext&) {
    return impl_->worker->register_table(spec, chosen);
  });
  std::lock_guard lock(impl_->pushes_mutex);
  if (impl_->tables.size() <= handle.value) impl_->tables.resize(handle.value + 1);
  impl_->tables[handle.value] = {spec, chosen};
  return handle;
}

std::pair<TableSpec, Compression> Client::Impl::table(TableHandle handle) const {
  std::lock_guard lock(pushes_mutex);
  if (handle.value >= tables.size())
    fail(ErrorCode::invalid_argument, "table handle {} was never registered", handle.value);
  return tables[handle.value];
}

TableSpec Client::table(TableHandle handle) const {
  return impl_->table(handle).first;
}

Compression Client::table_compression(TableHandle handle) const {
  return impl_->table(handle).second;
}

void Client::push_rows(TableHandle handle, Step step, std::span<const uint64_t> ids,
                       std::span<const std::byte> gradients) {
  std::shared_ptr<Completion> done;
  {
    std::lock_guard lock(impl_->pushes_mutex);
    done = impl_->file_push(impl_->row_pushes, "table", handle.value, step);
  }
  impl_->thread.loop().post([this, handle, step, ids, gradients, done] {
    impl_->settle(done, [&] { return impl_->worker->push_rows(handle, step, ids, gradients); });
  });
}

void Client::wait_rows(TableHandle handle, Step step) {
  std::shared_ptr<Completion> done;
  {
    std::lock_guard lock(impl_->pushes_mutex);
    done = impl_->take_push(impl_->row_pushes, "table", handle.value, step);
  }
  done->wait(impl_->wait_spin);
}

void Client::pull_rows(TableHandle handle, std::span<const uint64_t> ids, std::span<std::byte> out,
                       Step after) {
  start_pull_rows(handle, ids, out, after).wait();
}

RowsPull Client::start_pull_rows(TableHandle handle, std::span<const uint64_t> ids,
                                 std::span<std::byte> out, Step after, bool prefetch) {
  auto done = std::make_shared<Completion>();
  impl_->thread.loop().post([this, handle, ids, out, after, prefetch, done] {
    impl_->settle(done,
                  [&] { return impl_->worker->pull_rows(handle, after, ids, out, prefetch); });
  });
  return RowsPull(std::move(done));
}

void RowsPull::wait() const {
  done_->wait();
}

bool RowsPull::ready() const {
  return done_->ready();
}

SchedulerStats Client::scheduler_stats() {
  return impl_->ask_loop<SchedulerStats>(
      [this](auto reply) { impl_->worker->scheduler().stats(reply); });
}

TuningState Client::tuning() {
  return impl_->ask_loop<TuningState>(
      [this](auto reply) { impl_->worker->pusher().tuning(reply); });
}

std::vector<TaskRecord> Client::take_records() {
  return impl_->ask_loop<std::vector<TaskRecord>>(
      [this](auto reply) { impl_->worker->scheduler().take_records(reply); });
}

void Client::stats(std::function<void(WorkerStats)> reply) {
  WorkerStats stats;
  stats.worker = impl_->options.worker;
  {
    std::lock_guard lock(impl_->pushes_mutex);
    stats.iteration_seconds = impl_->iteration_seconds;
  }
  impl_->worker->scheduler().stats([stats, reply = std::move(reply)](SchedulerStats s) mutable {
    stats.scheduler = std::move(s);
    reply(std::move(stats));
  });
}

}  // namespace psched
