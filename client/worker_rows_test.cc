// SPDX-License-Identifier: Apache-2.0
// A Worker's embedding tables on the simulated cluster (tests/cluster.h): two shards, real RPC
// over in-memory pipes, both data paths (ctest runs it as worker_rows_test and
// worker_rows_test_calls). What the TableStepper sends lands on the shards' tables and comes
// back where the caller wants it; a sync worker a step ahead has its push held, not refused; a
// push resent after a cut connection applies once.
#include <algorithm>
#include <vector>

#include <doctest/doctest.h>

#include "client/worker.h"
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
