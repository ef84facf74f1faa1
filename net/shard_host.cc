#include "net/shard_host.h"

#include "common/error.h"
#include "common/log.h"
#include "net/cross_thread_promise.h"

namespace psched {

ShardHost::ShardHost(const DeploymentConfig& config, const std::vector<ShardId>& shards,
                     IoContext& io, unsigned apply_helpers)
    : config_(config), pool_(BufferPool::create()), apply_pool_(apply_helpers) {
  for (ShardId id : shards) {
    if (id.value >= config.shards.size())
      fail(ErrorCode::bad_config, "{}: there is no shard {} (the file names {})",
           config.source.string(), id.value, config.shards.size());
    auto hosted = std::make_unique<Hosted>();
    ShardSettings settings{id, config.mode, config.workers, config.limits.max_variables};
    hosted->shard = std::make_unique<VariableShard>(io, settings, pool_, &apply_pool_);
    hosted->endpoint = std::make_unique<ShardEndpoint>(ShardEndpoint{*hosted->shard, config, id});
    hosted->listener = std::make_unique<ShardListener>(*hosted->endpoint);
    hosted_.push_back(std::move(hosted));
  }
}

ShardHost::~ShardHost() = default;

kj::Promise<void> ShardHost::listen(kj::Network& network, kj::Timer& timer) {
  kj::Vector<kj::Promise<void>> accepting;
  for (auto& hosted : hosted_) {
    const ListenAddress& address = config_.shards[hosted->endpoint->id.value].listen;
    auto bound =
        network.parseAddress(address.host, address.port).then([](kj::Own<kj::NetworkAddress> a) {
          return a->listen();
        });
    accepting.add(bound.then(
        [h = hosted.get(), address, &timer](kj::Own<kj::ConnectionReceiver> receiver) {
          h->receiver = kj::mv(receiver);
          log_info("shard {} listening on {}", h->endpoint->id.value, address.to_string());
          return h->listener->listen(*h->receiver, timer);
        },
        [address](kj::Exception&& e) -> kj::Promise<void> {
          fail(ErrorCode::bad_config, "cannot listen on {}: {}", address.to_string(),
               e.getDescription().cStr());
        }));
  }
  return kj::joinPromises(accepting.releaseAsArray());
}

kj::Promise<void> ShardHost::shut_down() {
  kj::Vector<kj::Promise<void>> done;
  for (auto& hosted : hosted_) {
    auto [promise, fulfiller] = cross_thread_promise<void>();
    // clang 14 (the fuzz build) cannot capture a structured binding by name.
    hosted->shard->shut_down([fulfiller = fulfiller] { (*fulfiller)->fulfill(); });
    done.add(kj::mv(promise));
  }
  return kj::joinPromises(done.releaseAsArray());
}

}  // namespace psched
