#include "bench/shard_thread.h"

#include <optional>

#include <kj/async-io.h>

#include "actors/actor.h"
#include "common/log.h"
#include "net/shard_host.h"
#include "net/wire_convert.h"

namespace psched::bench {

ShardThread::ShardThread(DeploymentConfig config, unsigned actor_threads, unsigned apply_helpers)
    : config_(std::move(config)), actor_threads_(actor_threads), apply_helpers_(apply_helpers) {
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started] { run(started); });
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

ShardThread::~ShardThread() {
  executor_->executeSync([this] { stop_->fulfill(); });
  thread_.join();
}

void ShardThread::run(std::promise<void>& started) {
  auto io = kj::setupAsyncIo();
  ActorRuntime actors(actor_threads_);
  std::optional<ShardHost> host;
  try {
    std::vector<ShardId> all;
    for (uint32_t i = 0; i < config_.shards.size(); ++i) all.push_back(ShardId(i));
    host.emplace(config_, all, actors.io(), apply_helpers_);
    serve(*host, io, started);
  } catch (...) {
    started.set_exception(std::current_exception());  // serve() throws only before `started`
  }
  if (host) {
    host->shut_down().wait(io.waitScope);
    io.waitScope.poll();
  }
  actors.stop();  // before the host goes: its shards' handlers run on the actors
  stop_ = nullptr;
}

void ShardThread::serve(ShardHost& host, kj::AsyncIoContext& io, std::promise<void>& started) {
  auto stop = kj::newPromiseAndFulfiller<void>();
  stop_ = kj::mv(stop.fulfiller);
  executor_ = &kj::getCurrentThreadExecutor();
  host.restore().wait(io.waitScope);  // with a checkpoint directory configured
  auto serving = host.listen(io.provider->getNetwork(), io.provider->getTimer())
                     .eagerlyEvaluate([this](kj::Exception&& e) {
                       listen_error_ = std::make_exception_ptr(from_kj_exception(e));
                     });
  io.waitScope.poll();  // binds a numeric address: parse, listen(), accept loop started
  if (listen_error_) std::rethrow_exception(listen_error_);
  started.set_value();
  stop.promise.wait(io.waitScope);
  if (listen_error_) log_error("bench shard: accepting failed while serving");
}

}  // namespace psched::bench
