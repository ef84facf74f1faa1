// SPDX-License-Identifier: Apache-2.0
#include "server/shard_host.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "net/tls.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// The shard's compute device, or null for cpu.
std::unique_ptr<optim::ComputeDevice> open_device(const DeploymentConfig& config, ShardId id) {
  const optim::DeviceSpec& device = config.shards[id.value].device;
  if (device.kind == optim::DeviceSpec::Kind::cpu) return nullptr;
  try {
    auto opened = optim::ComputeDevice::open(device);
    log_info("shard {} keeps its variables on {}", id.value, optim::to_string(device));
    return opened;
  } catch (const Error& e) {
    fail(ErrorCode::bad_config, "{}: shards[{}].device: {}", config.source.string(), id.value,
         e.what());
  }
}

// What the shard now serves, logged.
void log_served(ShardId id, const ServedVersion& version, const char* what) {
  log_info("shard {}: {} {} (generation {}, step {}) read-only", id.value, what,
           version.checkpoint.string(), version.generation, version.step);
}

// A serving shard's settings take the served job's mode and worker count, which its steps and
// membership were recorded with; no step comes, so nothing times out and no lease ends.
// Returns that checkpoint, which the shard then serves first (its checksum checked once).
ShardStore::Checkpoint served_job(ShardSettings& settings) {
  ShardStore::Checkpoint newest = ShardDurability::newest_served(settings);
  ByteReader in(newest.payload, newest.file.string());
  const CheckpointHeader job = CheckpointHeader::decode(in);
  settings.mode = job.mode;
  settings.workers = job.workers;
  settings.steps.timeout_seconds = 0;
  settings.steps.lease_seconds = 0;
  settings.steps.min_workers = 0;
  return newest;
}

}  // namespace

ShardHost::ShardHost(const DeploymentConfig& config, const std::vector<ShardId>& shards,
                     ActorLoop& loop, ForkJoinPool* apply_pool)
    : config_(config),
      tls_(config.tls ? server_tls_context(*config.tls) : kj::Own<kj::TlsContext>()),
      accepting_(*this) {
  for (ShardId id : shards) {
    if (id.value >= config.shards.size())
      fail(ErrorCode::bad_config, "{}: there is no shard {} (the file names {})",
           config.source.string(), id.value, config.shards.size());
    auto hosted = std::make_unique<Hosted>();
    // A serving shard applies no update: its values stay in host memory, where it loads each
    // version beside the one served (a device is used on the shard's loop only).
    if (config.serve.directory.empty()) hosted->device = open_device(config, id);
    ShardSettings settings = shard_settings(config, id);
    if (!settings.serve_directory.empty()) hosted->first_served = served_job(settings);
    hosted->shard =
        std::make_unique<VariableShard>(loop, settings, apply_pool, hosted->device.get());
    hosted->endpoint = std::make_unique<ShardEndpoint>(ShardEndpoint{*hosted->shard, config, id});
    hosted->listener = std::make_unique<ShardListener>(*hosted->endpoint, tls_.get());
    hosted_.push_back(std::move(hosted));
  }
}

ShardHost::~ShardHost() = default;

void ShardHost::start_tracing(size_t capacity) {
  for (auto& hosted : hosted_) {
    if (!hosted->trace) hosted->trace = std::make_unique<ShardTrace>(capacity);
    hosted->endpoint->trace = hosted->trace.get();
  }
}

kj::Promise<void> ShardHost::listen(kj::Network& network, kj::Timer& timer) {
  kj::Vector<kj::Promise<void>> bound;
  for (auto& hosted : hosted_) {
    const ListenAddress& address = config_.shards[hosted->endpoint->id.value].listen;
    auto receiver =
        network.parseAddress(address.host, address.port).then([](kj::Own<kj::NetworkAddress> a) {
          return a->listen();
        });
    bound.add(receiver.then(
        [this, h = hosted.get(), address, &timer,
         tls = tls_.get() != nullptr](kj::Own<kj::ConnectionReceiver> receiver) {
          h->receiver = kj::mv(receiver);
          log_info("shard {} listening on {}{}", h->endpoint->id.value, address.to_string(),
                   tls ? " (TLS)" : "");
          accepting_.add(h->listener->listen(*h->receiver, timer));
        },
        [address](kj::Exception&& e) {
          fail(ErrorCode::bad_config, "cannot listen on {}: {}", address.to_string(),
               e.getDescription().cStr());
        }));
  }
  return kj::joinPromises(bound.releaseAsArray());
}

void ShardHost::taskFailed(kj::Exception&& exception) {
  log_error("accepting connections failed: {}", exception.getDescription().cStr());
}

template <typename Ask>
kj::Promise<void> ShardHost::on_every_shard(Ask ask) {
  kj::Vector<kj::Promise<void>> done;
  for (auto& hosted : hosted_) {
    auto [promise, fulfiller] = reply_promise<void>();
    ask(*hosted, fulfiller);
    done.add(kj::mv(promise));
  }
  return kj::joinPromises(done.releaseAsArray());
}

kj::Promise<void> ShardHost::shut_down() {
  return on_every_shard([](Hosted& hosted, SharedFulfiller<void> fulfiller) {
    hosted.shard->shut_down([fulfiller] { (*fulfiller)->fulfill(); });
  });
}

kj::Promise<void> ShardHost::restore() {
  if (serving()) {
    return on_every_shard([](Hosted& hosted, SharedFulfiller<void> fulfiller) {
      ShardStore::Checkpoint first = std::move(*hosted.first_served);
      hosted.first_served.reset();
      const ShardId id = hosted.endpoint->id;
      hosted.shard->serve(std::move(first),
                          [fulfiller, id](std::exception_ptr error, ServedVersion version) {
                            if (error) return (*fulfiller)->reject(to_kj_exception(error));
                            log_served(id, version, "serving");
                            (*fulfiller)->fulfill();
                          });
    });
  }
  if (config_.checkpoint.directory.empty()) return kj::READY_NOW;
  return on_every_shard([](Hosted& hosted, SharedFulfiller<void> fulfiller) {
    const ShardId id = hosted.endpoint->id;
    hosted.shard->restore([fulfiller, id](std::exception_ptr error, RestoreReport report) {
      for (const std::string& skipped : report.skipped)
        log_warn("shard {}: skipped {}", id.value, skipped);
      if (error) return (*fulfiller)->reject(to_kj_exception(error));
      if (report.checkpoint.empty())
        log_info("shard {}: no checkpoint found, starting empty", id.value);
      else
        log_info(
            "shard {}: restored {} variable part(s) and {} table(s) from {} and {} logged "
            "update(s)",
            id.value, report.variables, report.tables, report.checkpoint.string(), report.replayed);
      log_info("shard {}: checkpoint {} written", id.value, report.written.string());
      (*fulfiller)->fulfill();
    });
  });
}

kj::Promise<void> ShardHost::reload() {
  return on_every_shard([](Hosted& hosted, SharedFulfiller<void> fulfiller) {
    const ShardId id = hosted.endpoint->id;
    hosted.shard->reload(
        [fulfiller, id](std::exception_ptr error, std::optional<ServedVersion> version) {
          if (error)
            log_error("shard {}: {}; still serving the version it had", id.value,
                      to_error(error).what());
          else if (version)
            log_served(id, *version, "now serving");
          (*fulfiller)->fulfill();
        });
  });
}

kj::Promise<void> ShardHost::keep_reloading(kj::Timer& timer) {
  const double interval = config_.serve.reload_seconds;
  if (!serving() || interval <= 0) return kj::NEVER_DONE;
  auto delay = static_cast<int64_t>(interval * 1e3) * kj::MILLISECONDS;
  return timer.afterDelay(delay).then([this] { return reload(); }).then([this, &timer] {
    return keep_reloading(timer);
  });
}

kj::Promise<void> ShardHost::checkpoint() {
  if (config_.checkpoint.directory.empty() || serving()) return kj::READY_NOW;
  return on_every_shard([](Hosted& hosted, SharedFulfiller<void> fulfiller) {
    const ShardId id = hosted.endpoint->id;
    hosted.shard->checkpoint([fulfiller, id](std::exception_ptr error, std::filesystem::path file) {
      if (error) return (*fulfiller)->reject(to_kj_exception(error));
      log_info("shard {}: checkpoint {} written", id.value, file.string());
      (*fulfiller)->fulfill();
    });
  });
}

kj::Promise<void> ShardHost::keep_checkpointing(kj::Timer& timer) {
  double interval = config_.checkpoint.interval_seconds;
  if (config_.checkpoint.directory.empty() || serving() || interval <= 0) return kj::NEVER_DONE;
  auto delay = static_cast<int64_t>(interval * 1e3) * kj::MILLISECONDS;
  return timer.afterDelay(delay)
      .then([this] { return checkpoint(); })
      .catch_([](kj::Exception&& e) {
        log_error("checkpoint failed, retrying at the next interval: {}",
                  e.getDescription().cStr());
      })
      .then([this, &timer] { return keep_checkpointing(timer); });
}

kj::Promise<void> ShardHost::keep_enforcing_deadlines(kj::Timer& timer) {
  double timeout = config_.steps.timeout_seconds, lease = config_.steps.lease_seconds;
  if (config_.mode == Mode::async || (timeout <= 0 && lease <= 0)) return kj::NEVER_DONE;
  // A deadline is acted on at most a quarter of it (or 100 ms) late.
  double shortest = timeout <= 0 ? lease : lease <= 0 ? timeout : std::min(timeout, lease);
  auto period = static_cast<int64_t>(std::max(0.1, shortest / 4) * 1e3) * kj::MILLISECONDS;
  return timer.afterDelay(period).then([this, &timer] {
    for (auto& hosted : hosted_) hosted->shard->enforce_deadlines(std::chrono::steady_clock::now());
    return keep_enforcing_deadlines(timer);
  });
}

}  // namespace psched
