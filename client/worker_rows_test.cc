// SPDX-License-Identifier: Apache-2.0
// A Worker's embedding tables on the simulated cluster (tests/cluster.h): two shards, real RPC
// over in-memory pipes, both data paths (ctest runs it as worker_rows_test and
// worker_rows_test_calls). What the TableStepper sends lands on the shards' tables and comes
// back where the caller wants it; a sync worker a step ahead has its push held, not refused; a
// push resent after a cut connection applies once; a table the deployment's compression: makes
// bf16 sends half the bytes however small its batches, and the shard applies the rows as the
// dense path's codec decodes them.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>

#include "client/worker.h"
#include "compression/codec.h"
#include "config/deployment.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint32_t kShards = 2;
constexpr uint32_t kDim = 2;

// Table "emb": 1000 rows of two float32 elements, zeros at first, SGD lr 1.
TableSpec emb() {
  TableSpec spec{.name = "emb", .num_embeddings = 1000, .dim = kDim};
  spec.optimizer.lr = 1;
  return spec;
}

// `ids` with rows that hold `value` in each element.
std::vector<float> rows_of(const std::vector<uint64_t>& ids, float value) {
  return std::vector<float>(ids.size() * kDim, value);
}

struct RowsCluster {
  Cluster cluster;
  std::vector<Worker*> workers;
  std::vector<TableHandle> tables;

  RowsCluster(Mode mode, uint32_t count) : cluster(cluster_config(kShards, count, mode)) {
    for (uint32_t w = 0; w < count; ++w) {
      Worker& worker = cluster.add_worker(WorkerId(w), {});
      workers.push_back(&worker);
      tables.push_back(cluster.run(worker.register_table(emb())));
    }
  }
  kj::Promise<void> push(uint32_t w, uint64_t step, const std::vector<uint64_t>& ids,
                         const std::vector<float>& rows) {
    return workers[w]->push_rows(tables[w], Step(step), ids, std::as_bytes(std::span(rows)));
  }
  std::vector<float> pull(uint32_t w, uint64_t after, const std::vector<uint64_t>& ids) {
    std::vector<float> out(ids.size() * kDim, -99);
    cluster.run(
        workers[w]->pull_rows(tables[w], Step(after), ids, std::as_writable_bytes(std::span(out))));
    return out;
  }
  uint64_t pushes_held() {
    uint64_t held = 0;
    for (uint32_t s = 0; s < kShards; ++s)
      cluster.host().shard(s).stats([&](ShardStats stats) { held += stats.pushes_held; });
    cluster.settle();
    return held;
  }
};

// Ids 0..n-1: both shards hold some.
std::vector<uint64_t> first_ids(uint64_t n) {
  std::vector<uint64_t> ids(n);
  for (uint64_t k = 0; k < n; ++k) ids[k] = k;
  return ids;
}

}  // namespace

TEST_CASE("sync: two workers' row steps apply the mean on both shards; pulls land in order") {
  RowsCluster c(Mode::sync, 2);
  const std::vector<uint64_t> a = first_ids(10), b{3, 4, 500};
  auto pushed_a = c.push(0, 1, a, rows_of(a, 2));
  auto pushed_b = c.push(1, 1, b, rows_of(b, 4));
  c.cluster.run(kj::mv(pushed_a));
  c.cluster.run(kj::mv(pushed_b));
  // Rows both pushed: -(2 + 4) / 2; one worker's: -2 / 2 or -4 / 2; none: 0. Asked for out of
  // order, one twice.
  const std::vector<uint64_t> asked{500, 3, 9, 3, 777};
  const std::vector<float> expected{-2, -2, -3, -3, -1, -1, -3, -3, 0, 0};
  CHECK(c.pull(0, 1, asked) == expected);
  CHECK(c.pull(1, 1, asked) == expected);
}

TEST_CASE("sync: a worker a step ahead has its push held by the shard, and taken in turn") {
  RowsCluster c(Mode::sync, 2);
  const std::vector<uint64_t> ids = first_ids(6);
  c.cluster.run(c.push(0, 1, ids, rows_of(ids, 2)));
  auto ahead = c.push(0, 2, ids, rows_of(ids, 2));  // worker 1 has not pushed step 1
  c.cluster.settle();
  CHECK_FALSE(ahead.poll(c.cluster.scope()));
  CHECK(c.pushes_held() == kShards);
  c.cluster.run(c.push(1, 1, {}, {}));  // step 1 closes: worker 0's step 2 is taken
  c.cluster.run(kj::mv(ahead));
  c.cluster.run(c.push(1, 2, {}, {}));
  CHECK(c.pull(1, 2, {0, 5}) == std::vector<float>{-2, -2, -2, -2});  // two means of 2 and 0
}

TEST_CASE("async: a pull after a push reads the push's update; a repeated id lands twice") {
  RowsCluster c(Mode::async, 1);
  const std::vector<uint64_t> ids{11, 12, 13};
  c.cluster.run(c.push(0, 1, ids, {1, 2, 3, 4, 5, 6}));
  CHECK(c.pull(0, 1, {13, 11, 13}) == std::vector<float>{-5, -6, -1, -2, -5, -6});
}

TEST_CASE("a push of rows resent after a cut connection applies once") {
  RowsCluster c(Mode::async, 1);
  const std::vector<uint64_t> ids = first_ids(8);
  c.cluster.run(c.push(0, 1, ids, rows_of(ids, 1)));
  for (uint32_t shard = 0; shard < kShards; ++shard) c.cluster.cut(0, shard, 0);
  c.cluster.run(c.push(0, 2, ids, rows_of(ids, 1)));
  c.cluster.run(c.push(0, 3, ids, rows_of(ids, 1)));
  const std::vector<float> got = c.pull(0, 3, ids);
  CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == -3; }));
}

namespace {

// The compression a table registered without one takes from a deployment file whose
// compression: section is `section` (Client::register_table).
Compression deployment_rows(const std::string& section) {
  const std::string yaml = "shards: [{listen: 127.0.0.1:7000}]\ncompression: " + section + "\n";
  return parse_deployment(yaml, "worker_rows_test").compression.for_rows();
}

// The shards' wire bytes of pushes and of answered pulls, summed.
std::pair<WireBytes, WireBytes> wire_bytes(Cluster& cluster) {
  WireBytes push, pull;
  for (uint32_t s = 0; s < kShards; ++s)
    cluster.host().shard(s).stats([&](ShardStats stats) {
      push.raw += stats.push_wire.raw;
      push.sent += stats.push_wire.sent;
      pull.raw += stats.pull_wire.raw;
      pull.sent += stats.pull_wire.sent;
    });
  cluster.settle();
  return {push, pull};
}

// What push_three_batches brings: the rows as the shards hold them, and the shards' wire bytes
// of pushes and of answered pulls.
struct ThreeBatches {
  std::vector<float> rows;
  WireBytes push, pull;
};

// One worker of an async cluster registers `spec` (a zero table, SGD lr 1) with `compression`,
// pushes three steps of `gradient` (64 rows of dim 16) for 64 new ids each (12,288 bytes of
// float32 rows in all), then pulls all 192 rows.
ThreeBatches push_three_batches(const TableSpec& spec, const Compression& compression,
                                const std::vector<float>& gradient) {
  Cluster cluster(cluster_config(kShards, 1, Mode::async));
  Worker& worker = cluster.add_worker(WorkerId(0), {});
  const TableHandle table = cluster.run(worker.register_table(spec, compression));
  std::vector<uint64_t> all;
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<uint64_t> ids(64);
    for (uint64_t k = 0; k < ids.size(); ++k) ids[k] = 1000 * step + k;
    cluster.run(worker.push_rows(table, Step(step), ids, std::as_bytes(std::span(gradient))));
    all.insert(all.end(), ids.begin(), ids.end());
  }
  ThreeBatches got;
  got.rows.assign(all.size() * 16, -99);
  cluster.run(worker.pull_rows(table, Step(3), all, std::as_writable_bytes(std::span(got.rows))));
  std::tie(got.push, got.pull) = wire_bytes(cluster);
  return got;
}

}  // namespace

TEST_CASE("a table bf16 by the deployment sends half the bytes of a small batch, applied decoded") {
  const Compression rows = deployment_rows("{push: bf16, pull: bf16}");  // min_bytes 64 KiB
  TableSpec spec{.name = "wide", .num_embeddings = 100'000, .dim = 16};  // 6.4 MB of rows
  spec.optimizer.lr = 1;
  std::vector<float> gradient(64 * 16);  // none of them a bf16 value
  for (size_t k = 0; k < gradient.size(); ++k) gradient[k] = 1 + float(2 * k + 1) / 8192;
  std::vector<std::byte> narrowed;  // the gradient as the dense path encodes and decodes it
  encode(WireFormat::bf16, DType::float32, std::as_bytes(std::span(gradient)), {}, narrowed);
  std::vector<float> applied(gradient.size());
  decode(WireFormat::bf16, DType::float32, narrowed, std::as_writable_bytes(std::span(applied)));

  SUBCASE("a table of min_bytes or more: every request narrowed") {
    const auto [got, push, pull] = push_three_batches(spec, rows, gradient);
    CHECK(push.raw == 12'288);
    CHECK(push.sent == 6'144);
    CHECK(pull.raw == 12'288);
    CHECK(pull.sent == 6'144);
    for (size_t k = 0; k < got.size(); ++k)  // SGD from zeros: minus the decoded gradient
      REQUIRE(got[k] == -applied[k % applied.size()]);
  }
  SUBCASE("a table under min_bytes: whole both ways") {
    spec.num_embeddings = 4000;  // 256,000 bytes of rows: one byte under min_bytes
    const Compression small = deployment_rows("{push: bf16, pull: bf16, min_bytes: 256001}");
    const auto [got, push, pull] = push_three_batches(spec, small, gradient);
    CHECK(push.sent == 12'288);
    CHECK(pull.sent == 12'288);
    for (size_t k = 0; k < got.size(); ++k) REQUIRE(got[k] == -gradient[k % gradient.size()]);
  }
}
