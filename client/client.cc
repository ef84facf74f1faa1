#include "client/client.h"

#include <chrono>

#include <kj/async-io.h>

#include "common/error.h"
#include "common/malloc_tuning.h"
#include "net/wire_convert.h"

namespace psched {

ClientOptions ClientOptions::from_config(const DeploymentConfig& config, WorkerId worker) {
  ClientOptions options;
  for (const ShardConfig& shard : config.shards) options.shards.push_back(shard.listen.to_string());
  options.worker = worker;
  options.token = config.auth_token;
  options.tls = config.tls;
  options.scheduler = config.scheduler;
  options.max_message_bytes = config.limits.max_message_bytes;
  options.reconnect_timeout_seconds = config.reconnect.timeout_seconds;
  return options;
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  tune_malloc_for_large_messages();
  try {
    layout_ = thread_.call([this](kj::AsyncIoContext& io) { return start(io); });
  } catch (...) {
    thread_.call([this](kj::AsyncIoContext&) {
      worker_.reset();
      connector_.reset();
    });
    throw;
  }
}

Client::~Client() {
  thread_.call([this](kj::AsyncIoContext&) {
    worker_.reset();
    connector_.reset();
  });
}

kj::Promise<ClusterLayout> Client::start(kj::AsyncIoContext& io) {
  connector_ = std::make_unique<ShardConnector>(io.provider->getNetwork(), options_.tls);
  StreamWrap wrap;
  if (options_.wrap_stream)
    wrap = [this, &timer = io.provider->getTimer()](kj::Own<kj::AsyncIoStream> stream) {
      return options_.wrap_stream(kj::mv(stream), timer);
    };
  ReconnectPolicy policy{.timer = &io.provider->getTimer()};
  policy.timeout =
      static_cast<int64_t>(options_.reconnect_timeout_seconds * 1e3) * kj::MILLISECONDS;
  std::vector<kj::Own<ShardLink>> links;
  for (const std::string& address : options_.shards) {
    StreamOpener open = [this, address, wrap] { return connector_->open(address, wrap); };
    links.push_back(
        kj::heap<ShardLink>(address, std::move(open), options_.max_message_bytes, policy));
  }
  WorkerOptions worker{options_.worker, options_.token, options_.scheduler};
  worker_ = std::make_unique<Worker>(thread_.loop(), kj::mv(links), worker);
  return worker_->connect().then([this] { return worker_->layout(); });
}

template <typename T, typename Ask>
T Client::ask_loop(Ask ask) {
  return thread_.call([ask = std::move(ask)](kj::AsyncIoContext&) mutable {
    auto [promise, f] = reply_promise<T>();
    ask([f = f](T v) { (*f)->fulfill(std::move(v)); });
    return kj::mv(promise);
  });
}

VariableHandle Client::register_variable(const VariableSpec& spec, std::span<std::byte> value,
                                         bool use_server_optimizer) {
  return thread_.call([this, spec, value, use_server_optimizer](kj::AsyncIoContext&) {
    return worker_->register_variable(spec, value, use_server_optimizer);
  });
}

void Client::pull(VariableHandle handle) {
  thread_.call([this, handle](kj::AsyncIoContext&) { return worker_->pull(handle); });
}

void Client::push(VariableHandle handle, Step step, std::span<const std::byte> gradient) {
  auto done = std::make_shared<std::promise<void>>();
  {
    std::lock_guard lock(pushes_mutex_);
    auto [it, fresh] = pushes_.try_emplace({handle.value, step}, done->get_future());
    if (!fresh)
      fail(ErrorCode::stale_step, "push of variable handle {} step {} is already in flight",
           handle.value, step);
    if (step > newest_step_) {
      auto now = std::chrono::steady_clock::now();
      if (newest_step_ > 0)
        iteration_seconds_.observe(
            std::chrono::duration<double>(now - newest_step_pushed_).count());
      newest_step_ = step;
      newest_step_pushed_ = now;
    }
  }
  // The one hop of a push; its `done` wakes the trainer's wait once.
  thread_.loop().post([this, handle, step, gradient, done] {
    worker_->push(handle, step, gradient, [done](std::exception_ptr error) {
      error ? done->set_exception(error) : done->set_value();
    });
  });
}

Client::PendingPushes::iterator Client::find_push(VariableHandle handle, Step step) {
  auto it = pushes_.find({handle.value, step});
  if (it == pushes_.end())
    fail(ErrorCode::invalid_argument,
         "variable handle {} step {}: no such push (never pushed, or already waited for)",
         handle.value, step);
  return it;
}

void Client::wait(VariableHandle handle, Step step) {
  std::future<void> done;
  {
    std::lock_guard lock(pushes_mutex_);
    auto it = find_push(handle, step);
    done = std::move(it->second);
    pushes_.erase(it);
  }
  done.get();
}

bool Client::ready(VariableHandle handle, Step step) {
  std::lock_guard lock(pushes_mutex_);
  return find_push(handle, step)->second.wait_for(std::chrono::seconds(0)) ==
         std::future_status::ready;
}

SchedulerStats Client::scheduler_stats() {
  return ask_loop<SchedulerStats>([this](auto reply) { worker_->scheduler().stats(reply); });
}

TuningState Client::tuning() {
  return ask_loop<TuningState>([this](auto reply) { worker_->pusher().tuning(reply); });
}

std::vector<TaskRecord> Client::take_records() {
  return ask_loop<std::vector<TaskRecord>>(
      [this](auto reply) { worker_->scheduler().take_records(reply); });
}

void Client::stats(std::function<void(WorkerStats)> reply) {
  WorkerStats stats;
  stats.worker = options_.worker;
  {
    std::lock_guard lock(pushes_mutex_);
    stats.iteration_seconds = iteration_seconds_;
  }
  worker_->scheduler().stats([stats, reply = std::move(reply)](SchedulerStats s) mutable {
    stats.scheduler = std::move(s);
    reply(std::move(stats));
  });
}

}  // namespace psched
