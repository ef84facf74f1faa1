// SPDX-License-Identifier: Apache-2.0
// Compressed pushes and values on the simulated cluster, over both front ends: what the shard
// applies is what a sequential reference applies after the same quantization, a push that
// decodes badly changes nothing, workers of different formats share a shard, and the shard
// counts the bytes each way.
#include <cmath>
#include <random>

#include <doctest/doctest.h>

#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 600;  // 2400 bytes of float32: one partition, one shard
constexpr uint32_t kWorkers = 2;

optim::OptimizerSpec momentum() {
  optim::OptimizerSpec spec;
  spec.kind = optim::OptimizerKind::momentum;
  spec.lr = 0.1;
  spec.momentum = 0.9;
  return spec;
}

optim::OptimizerSpec adam() {
  optim::OptimizerSpec spec;
  spec.kind = optim::OptimizerKind::adam;
  spec.lr = 0.01;
  return spec;
}

optim::OptimizerSpec sgd() {
  optim::OptimizerSpec spec;
  spec.kind = optim::OptimizerKind::sgd;
  spec.lr = 0.1;
  return spec;
}

std::vector<float> normal_values(uint64_t seed, float scale = 1.0f) {
  std::mt19937 random(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(kElements);
  for (float& x : out) x = normal(random);
  return out;
}

std::vector<float> gradient(uint32_t worker, uint64_t step) {
  return normal_values(1000 + 100 * step + worker);
}

std::span<std::byte> bytes_of(std::vector<float>& v) {
  return std::as_writable_bytes(std::span(v));
}
std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

Compression compression(WireFormat push, WireFormat pull) {
  return {.push = push, .pull = pull, .topk = {.fraction = 0.05}, .min_bytes = 0};
}

SchedulerConfig one_partition() {
  SchedulerConfig s;
  s.partition_bytes = 4096;
  return s;
}

DeploymentConfig one_shard(Mode mode) {
  DeploymentConfig config = cluster_config(1, kWorkers, mode);
  return config;
}

// What the shard should hold after `steps` sync steps: each worker's gradient encoded as
// `c` says (with error feedback where the format needs it) and decoded, averaged, applied; a
// topk step (sparse) with the variance frozen after the last whole step, if any.
std::vector<float> sync_reference(const Compression& c, const optim::OptimizerSpec& spec,
                                  uint64_t steps) {
  std::vector<float> param = normal_values(1);
  std::vector<std::vector<float>> slots(optim::state_slots(spec), std::vector<float>(kElements));
  std::vector<std::span<float>> state(slots.begin(), slots.end());
  std::vector<std::vector<float>> residual(kWorkers, std::vector<float>(kElements));
  std::vector<std::byte> body, scratch;
  uint64_t last_whole = 0;
  for (uint64_t s = 1; s <= steps; ++s) {
    std::vector<float> mean(kElements);
    const WireFormat format = c.push_at(s, kElements * 4);
    for (uint32_t w = 0; w < kWorkers; ++w) {
      std::vector<float> g = gradient(w, s), sent(kElements);
      if (needs_feedback(format))
        encode_with_feedback(format, DType::float32, bytes_of(g), bytes_of(residual[w]), c.topk,
                             body, scratch);
      else
        encode(format, DType::float32, bytes_of(g), c.topk, body);
      decode(format, DType::float32, body, bytes_of(sent));
      for (uint64_t i = 0; i < kElements; ++i) mean[i] += sent[i];
    }
    for (float& m : mean) m *= 1.0f / kWorkers;
    const bool sparse = format == WireFormat::topk;
    if (!sparse) last_whole = s;
    optim::apply(spec, std::span(param), std::span<const float>(mean), state, s,
                 sparse ? last_whole : 0);
  }
  return param;
}

// A worker and its variable's memory; movable, never copied (the worker writes into `value`).
struct Trainer {
  Worker* worker;
  std::vector<float> value = normal_values(1);
  VariableHandle handle;
};

// One trainer per entry of `formats`, worker ids in order, each registering "w".
std::vector<Trainer> join(Cluster& cluster, const std::vector<Compression>& formats,
                          optim::OptimizerSpec optimizer = momentum()) {
  std::vector<Trainer> trainers;
  trainers.reserve(formats.size());
  for (uint32_t id = 0; id < formats.size(); ++id) {
    Trainer& t = trainers.emplace_back(Trainer{&cluster.add_worker(WorkerId(id), one_partition())});
    VariableSpec spec{"w", {kElements}, DType::float32, Priority(0), optimizer};
    t.handle =
        cluster.run(t.worker->register_variable(spec, bytes_of(t.value), false, formats[id]));
  }
  return trainers;
}

// Each trainer pushes step `s`'s gradient; returns the errors (null: applied and polled).
std::vector<std::exception_ptr> step(Cluster& cluster, std::vector<Trainer>& trainers, uint64_t s,
                                     const std::vector<std::vector<float>>& grads) {
  std::vector<std::exception_ptr> errors(trainers.size());
  size_t done = 0;
  for (size_t w = 0; w < trainers.size(); ++w)
    trainers[w].worker->push(trainers[w].handle, Step(s), bytes_of(grads[w]),
                             [&, w](std::exception_ptr e) {
                               errors[w] = e;
                               ++done;
                             });
  cluster.run_until([&] { return done == trainers.size(); });
  return errors;
}

ShardStats shard_stats(Cluster& cluster) {
  ShardStats stats;
  cluster.host().shard(0).stats([&](ShardStats s) { stats = s; });
  cluster.settle();
  return stats;
}

std::vector<float> narrowed(WireFormat format, const std::vector<float>& values) {
  std::vector<std::byte> body(encoded_bytes(format, DType::float32, values.size()));
  narrow_values(format, DType::float32, bytes_of(values), body);
  std::vector<float> out(values.size());
  decode(format, DType::float32, body, bytes_of(out));
  return out;
}

}  // namespace

TEST_CASE(
    "sync mode with each wire format equals a reference that quantizes the same way and freezes "
    "adam's variance for sparse steps after a warm-up") {
  // The shard's optimizer sees the decoded gradient, stateful ones too (docs/compression.md).
  for (const optim::OptimizerSpec& optimizer : {momentum(), adam()}) {
    const std::vector<std::pair<WireFormat, WireFormat>> formats = {
        {WireFormat::bf16, WireFormat::bf16},
        {WireFormat::fp16, WireFormat::fp16},
        {WireFormat::topk, WireFormat::none},
        {WireFormat::onebit, WireFormat::bf16},
        {WireFormat::none, WireFormat::fp16}};
    for (const auto& both : formats) {
      const WireFormat push = both.first, pull = both.second;
      for (uint64_t warmup : {0, 2}) {
        Compression c = compression(push, pull);
        c.warmup_steps = warmup;
        INFO("push " << to_string(push) << ", values " << to_string(pull) << ", warm-up " << warmup
                     << ", " << optim::to_string(optimizer.kind));
        Cluster cluster(one_shard(Mode::sync));
        std::vector<Trainer> trainers = join(cluster, {c, c}, optimizer);
        const uint64_t steps = 5;
        for (uint64_t s = 1; s <= steps; ++s) {
          std::vector<std::vector<float>> grads;
          for (uint32_t w = 0; w < kWorkers; ++w) grads.push_back(gradient(w, s));
          for (auto& e : step(cluster, trainers, s, grads)) REQUIRE_FALSE(e);
        }
        std::vector<float> reference = sync_reference(c, optimizer, steps);
        // The trainers hold the shard's value as it travelled; the shard keeps it whole.
        for (Trainer& t : trainers) CHECK(t.value == narrowed(pull, reference));
        cluster.run(trainers[0].worker->pull(trainers[0].handle));
        CHECK(trainers[0].value == reference);
      }
    }
  }
}

TEST_CASE("a compressed push that decodes to an infinity is refused and changes nothing") {
  Cluster cluster(one_shard(Mode::async));
  std::vector<Trainer> trainers = join(cluster, {compression(WireFormat::fp16, WireFormat::none)});
  std::vector<float> too_large = gradient(0, 1);
  too_large[7] = 1e6f;  // over fp16's range
  std::vector<std::exception_ptr> errors = step(cluster, trainers, 1, {too_large});
  REQUIRE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK_MESSAGE(std::string(e.what()).find("fp16 gradient decodes to an infinity or a NaN") !=
                      std::string::npos,
                  e.what());
  }
  cluster.run(trainers[0].worker->pull(trainers[0].handle));
  CHECK(trainers[0].value == normal_values(1));
  CHECK(shard_stats(cluster).errors[static_cast<size_t>(ErrorCode::invalid_argument)] == 1);
}

TEST_CASE("workers pushing in different formats share a shard, each answered in its own") {
  Cluster cluster(one_shard(Mode::async));
  std::vector<Trainer> trainers = join(cluster,
                                       {compression(WireFormat::bf16, WireFormat::bf16),
                                        compression(WireFormat::topk, WireFormat::none)},
                                       sgd());
  std::vector<std::vector<float>> grads{gradient(0, 1), gradient(1, 1)};
  for (auto& e : step(cluster, trainers, 1, grads)) REQUIRE_FALSE(e);
  cluster.run(trainers[1].worker->pull(trainers[1].handle));
  // Plain SGD: each push moves the value by lr x its decoded gradient, in either order.
  std::vector<float> expected = normal_values(1);
  std::vector<float> bf16 = narrowed(WireFormat::bf16, grads[0]);
  std::vector<float> topk(kElements);
  std::vector<std::byte> body;
  encode(WireFormat::topk, DType::float32, bytes_of(grads[1]), {.fraction = 0.05}, body);
  decode(WireFormat::topk, DType::float32, body, bytes_of(topk));
  for (uint64_t i = 0; i < kElements; ++i) {
    float after_both = expected[i] - 0.1f * bf16[i] - 0.1f * topk[i];
    CHECK(trainers[1].value[i] == doctest::Approx(after_both).epsilon(1e-6));
  }
}

TEST_CASE("the shard counts payload bytes as the dtype carries them and as they travelled") {
  SUBCASE("bf16 both ways: half") {
    Cluster cluster(one_shard(Mode::async));
    std::vector<Trainer> trainers =
        join(cluster, {compression(WireFormat::bf16, WireFormat::bf16)});
    for (uint64_t s = 1; s <= 3; ++s)
      REQUIRE_FALSE(step(cluster, trainers, s, {gradient(0, s)})[0]);
    ShardStats stats = shard_stats(cluster);
    CHECK(stats.push_wire.raw == 3 * kElements * 4);
    CHECK(stats.push_wire.sent == 3 * kElements * 2);
    CHECK(stats.pull_wire.raw == 3 * kElements * 4);
    CHECK(stats.pull_wire.sent == 3 * kElements * 2);
  }
  SUBCASE("topk of 5%: its indices and values") {
    Cluster cluster(one_shard(Mode::async));
    std::vector<Trainer> trainers =
        join(cluster, {compression(WireFormat::topk, WireFormat::none)});
    REQUIRE_FALSE(step(cluster, trainers, 1, {gradient(0, 1)})[0]);
    ShardStats stats = shard_stats(cluster);
    CHECK(stats.push_wire.raw == kElements * 4);
    CHECK(stats.push_wire.sent == 8 + 30 * 8);
    CHECK(stats.pull_wire.sent == stats.pull_wire.raw);
  }
  SUBCASE("a variable under min_bytes travels as it is") {
    Cluster cluster(one_shard(Mode::async));
    Compression c = compression(WireFormat::bf16, WireFormat::bf16);
    c.min_bytes = kElements * 4 + 1;
    std::vector<Trainer> trainers = join(cluster, {c});
    REQUIRE_FALSE(step(cluster, trainers, 1, {gradient(0, 1)})[0]);
    ShardStats stats = shard_stats(cluster);
    CHECK(stats.push_wire.sent == stats.push_wire.raw);
    CHECK(stats.pull_wire.sent == stats.pull_wire.raw);
    CHECK(stats.push_wire.raw == kElements * 4);
  }
}
