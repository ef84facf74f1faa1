// SPDX-License-Identifier: Apache-2.0
#include "tests/fuzz/fuzz_shard.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/data_frame.h"

namespace psched::fuzz {
namespace {

// What a fed connection's client sends, and the shard's read waiting for it. Shared by the
// stream (owned by the shard's connection, which may end first) and FuzzShard::feed.
struct Feed {
  std::span<const uint8_t> rest;
  // Whether `rest` is Cap'n Proto messages: a read then gets at most one, as from a client
  // that waits for each answer before it sends its next message (a Finish that came before
  // its call's return would cancel the call, and the next call would reuse its question id).
  bool one_message_a_read = false;
  size_t message_left = 0;     // of the message being delivered
  bool closed = false;         // the end of the input was delivered
  kj::byte* buffer = nullptr;  // of the waiting read
  size_t max = 0;
  kj::Own<kj::PromiseFulfiller<size_t>> read;  // null when no read waits

  // Answers the waiting read with up to its `max` bytes, or with the end of the input (the
  // client closed). False when no read waits (any more) or the end was delivered.
  bool deliver() {
    if (closed || !read || !read->isWaiting()) return false;
    if (one_message_a_read && message_left == 0) message_left = next_message_bytes();
    size_t n = std::min({max, rest.size(), one_message_a_read ? message_left : max});
    if (one_message_a_read) message_left -= n;
    std::memcpy(buffer, rest.data(), n);
    rest = rest.subspan(n);
    closed = n == 0;
    auto answered = kj::mv(read);
    answered->fulfill(kj::cp(n));
    return true;
  }

  // The bytes of the message `rest` starts with, by its segment table (a word count per
  // segment after the count of segments); all of `rest` when the table makes no sense.
  size_t next_message_bytes() const {
    auto word = [&](size_t i) {
      uint32_t w = 0;
      if (4 * (i + 1) <= rest.size()) std::memcpy(&w, rest.data() + 4 * i, 4);
      return w;
    };
    uint64_t segments = uint64_t{word(0)} + 1;
    if (segments > 512) return rest.size();
    uint64_t bytes = ((segments + 2) / 2) * 8;  // the table, padded to a word
    for (uint64_t i = 0; i < segments; ++i) bytes += uint64_t{word(1 + i)} * 8;
    return std::max<uint64_t>(1, std::min<uint64_t>(bytes, rest.size()));
  }
};

// The shard's end of a fed connection: reads wait for Feed::deliver; writes are dropped.
class FedStream final : public kj::AsyncIoStream {
 public:
  explicit FedStream(std::shared_ptr<Feed> feed) : feed_(std::move(feed)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    auto read = kj::newPromiseAndFulfiller<size_t>();
    feed_->buffer = static_cast<kj::byte*>(buffer);
    feed_->max = max;
    feed_->read = kj::mv(read.fulfiller);
    return kj::mv(read.promise);
  }
  kj::Promise<void> write(const void*, size_t) override { return kj::READY_NOW; }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>>) override {
    return kj::READY_NOW;
  }
  kj::Promise<void> whenWriteDisconnected() override { return kj::NEVER_DONE; }
  void shutdownWrite() override {}

 private:
  std::shared_ptr<Feed> feed_;
};

}  // namespace

DeploymentConfig fuzz_config(Mode mode) {
  DeploymentConfig config;
  config.source = "fuzz";
  config.mode = mode;
  config.workers = 2;
  config.auth_token = "fuzz";
  config.shards.push_back({ListenAddress{"pipe", 1000}});
  config.limits.max_message_bytes = 1 << 20;
  config.limits.max_variables = 8;
  config.limits.max_name_bytes = 64;
  config.limits.max_shape_dims = 4;
  config.limits.max_token_bytes = 64;
  config.limits.max_connections = 4;
  config.limits.max_waiting_polls = 16;
  return config;
}

Mode input_mode(std::span<const uint8_t> input) {
  return !input.empty() && (input[0] & 1) ? Mode::sync : Mode::async;
}

bool input_eager(std::span<const uint8_t> input) {
  return !input.empty() && (input[0] & 2);
}

bool input_data_stream(std::span<const uint8_t> input) {
  return !input.empty() && (input[0] & 4);
}

FuzzShard::FuzzShard(Mode mode) : config_(fuzz_config(mode)), scope_(loop_) {
  ShardSettings settings{ShardId(0), config_.mode, config_.workers, config_.limits.max_variables};
  shard_ = std::make_unique<VariableShard>(actors_, settings);
  endpoint_ = std::make_unique<ShardEndpoint>(ShardEndpoint{*shard_, config_, ShardId(0)});
  listener_ = std::make_unique<ShardListener>(*endpoint_);
}

FuzzShard::~FuzzShard() {
  settle();
  auto [promise, fulfiller] = kj::newPromiseAndFulfiller<void>();
  shard_->shut_down([f = fulfiller.get()] { f->fulfill(); });
  run(kj::mv(promise));
  listener_.reset();
  settle();
}

kj::Own<kj::AsyncIoStream> FuzzShard::connect() {
  auto pipe = kj::newTwoWayPipe();
  listener_->serve(kj::mv(pipe.ends[0]));
  return kj::mv(pipe.ends[1]);
}

void FuzzShard::feed(std::span<const uint8_t> bytes, bool eager) {
  bool data_stream = bytes.size() >= kDataPreface.size() &&
                     std::memcmp(bytes.data(), kDataPreface.data(), kDataPreface.size()) == 0;
  auto feed = std::make_shared<Feed>(Feed{bytes, !data_stream});
  listener_->serve(kj::heap<FedStream>(feed));
  if (eager) {
    do scope_.poll();
    while (feed->deliver());
  }
  do settle();
  while (feed->deliver());
}

void FuzzShard::register_data_variables() {
  if (data_variables_) return;
  data_variables_ = true;
  VariableSpec floats{"data/f32", {kDataFloatElements}, DType::float32, Priority(1), {}};
  VariableSpec doubles{"data/f64", {kDataDoubleElements}, DType::float64, Priority(0), {}};
  doubles.optimizer.kind = optim::OptimizerKind::adam;
  std::vector<std::byte> initial(kDataFloatElements * 4);
  for (const VariableSpec& spec : {floats, doubles})
    shard_->register_variable(spec, {0, spec.shape[0]},
                              {initial.data(), spec.shape[0] * element_bytes(spec.dtype)},
                              [](const Result<VariableShard::Registration>& registered) {
                                if (!registered) throw registered.error();
                              });
  settle();
}

void FuzzShard::feed_data(std::span<const uint8_t> frames, bool eager) {
  register_data_variables();
  const std::string key(kDataKeyBytes, 'k');
  endpoint_->data_keys.emplace(key, WorkerId(0));
  auto input = std::make_shared<std::vector<uint8_t>>(kDataPreface.begin(), kDataPreface.end());
  input->insert(input->end(), key.begin(), key.end());
  input->insert(input->end(), frames.begin(), frames.end());
  feed(*input, eager);
}

void FuzzShard::settle() {
  scope_.poll();  // runs until nothing is left to do
}

ShardStats FuzzShard::stats() {
  auto [promise, fulfiller] = kj::newPromiseAndFulfiller<ShardStats>();
  shard_->stats([f = fulfiller.get()](ShardStats s) { f->fulfill(kj::mv(s)); });
  return run(kj::mv(promise));
}

void FuzzShard::stalled() {
  throw std::runtime_error("the fuzz shard went idle before the awaited answer came");
}

void run_input(std::span<const uint8_t> input) {
  FuzzShard shard(input_mode(input));
  std::span<const uint8_t> rest = input.empty() ? input : input.subspan(1);
  if (input_data_stream(input))
    shard.feed_data(rest, input_eager(input));
  else
    shard.feed(rest, input_eager(input));
}

}  // namespace psched::fuzz
