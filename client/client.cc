#include "client/client.h"

#include <chrono>

#include <kj/async-io.h>

#include "common/error.h"
#include "common/malloc_tuning.h"
#include "net/shard_connector.h"
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

Client::Client(ClientOptions options) : options_(std::move(options)), actors_(1) {
  tune_malloc_for_large_messages();
  std::promise<void> started;
  auto ready = started.get_future();
  kj_thread_ = std::thread([this, &started] { run_kj_thread(started); });
  try {
    ready.get();
  } catch (...) {
    mailbox_.close();
    kj_thread_.join();
    actors_.stop();
    throw;
  }
}

Client::~Client() {
  actors_.stop();  // no more actor work that could post to the mailbox
  mailbox_.close();
  if (kj_thread_.joinable()) kj_thread_.join();
}

void Client::run_kj_thread(std::promise<void>& started) {
  auto io = kj::setupAsyncIo();
  std::optional<ShardConnector> connector;  // outlives the links, which reconnect with it
  try {
    std::vector<kj::Own<ShardLink>> links;
    connector.emplace(io.provider->getNetwork(), options_.tls);
    StreamWrap wrap;
    if (options_.wrap_stream)
      wrap = [this, &timer = io.provider->getTimer()](kj::Own<kj::AsyncIoStream> stream) {
        return options_.wrap_stream(kj::mv(stream), timer);
      };
    ReconnectPolicy policy{.timer = &io.provider->getTimer()};
    policy.timeout =
        static_cast<int64_t>(options_.reconnect_timeout_seconds * 1e3) * kj::MILLISECONDS;
    for (const std::string& address : options_.shards) {
      StreamOpener open = [&connector, address, wrap] { return connector->open(address, wrap); };
      links.push_back(
          kj::heap<ShardLink>(address, std::move(open), options_.max_message_bytes, policy));
    }
    WorkerOptions worker{options_.worker, options_.token, options_.scheduler};
    worker_ = std::make_unique<Worker>(actors_.io(), mailbox_, kj::mv(links), worker);
    worker_->connect().wait(io.waitScope);
    layout_ = worker_->layout();
  } catch (const kj::Exception& e) {
    worker_.reset();
    started.set_exception(std::make_exception_ptr(from_kj_exception(e)));
    return;
  } catch (...) {
    worker_.reset();
    started.set_exception(std::current_exception());
    return;
  }
  started.set_value();
  mailbox_.run().wait(io.waitScope);
  worker_.reset();
}

template <typename T, typename Work>
T Client::on_kj_thread(Work work) {
  auto result = std::make_shared<std::promise<T>>();
  auto future = result->get_future();
  mailbox_.post([result, work = std::move(work), this]() mutable {
    try {
      work()
          .then([result](auto... value) { result->set_value(std::move(value)...); },
                [result](kj::Exception&& e) {
                  result->set_exception(std::make_exception_ptr(from_kj_exception(e)));
                })
          .detach([](kj::Exception&&) {});
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  });
  return future.get();
}

VariableHandle Client::register_variable(const VariableSpec& spec, std::span<std::byte> value,
                                         bool use_server_optimizer) {
  return on_kj_thread<VariableHandle>([this, spec, value, use_server_optimizer] {
    return worker_->register_variable(spec, value, use_server_optimizer);
  });
}

void Client::pull(VariableHandle handle) {
  on_kj_thread<void>([this, handle] { return worker_->pull(handle); });
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
  worker_->push(handle, step, gradient, [done](std::exception_ptr error) {
    error ? done->set_exception(error) : done->set_value();
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
  std::promise<SchedulerStats> result;
  auto future = result.get_future();
  worker_->scheduler().stats([&result](SchedulerStats s) { result.set_value(s); });
  return future.get();
}

TuningState Client::tuning() {
  std::promise<TuningState> result;
  auto future = result.get_future();
  worker_->pusher().tuning([&result](TuningState s) { result.set_value(s); });
  return future.get();
}

std::vector<TaskRecord> Client::take_records() {
  std::promise<std::vector<TaskRecord>> result;
  auto future = result.get_future();
  worker_->scheduler().take_records(
      [&result](std::vector<TaskRecord> r) { result.set_value(std::move(r)); });
  return future.get();
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
