// SPDX-License-Identifier: Apache-2.0
// LinkTransport on the simulated cluster (tests/cluster.h): what it reports for each task, and
// how it carries partitions again after their connection was lost. ctest runs it over both
// data paths (PSCHED_TEST_DATA_PATH).
#include "link/link_transport.h"

#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 16;

// One task's reports, as the scheduler would count them.
struct Reports final : TaskReports {
  uint64_t task_id = 0;  // the task reported on; another id is a bug of the transport's
  int receipts = 0;
  int done = 0;
  std::optional<Error> error;
  int64_t applied_at_ns = 0;

  void received(uint64_t id) override {
    CHECK(id == task_id);
    ++receipts;
  }
  void finished(uint64_t id, TaskOutcome outcome) override {
    CHECK(id == task_id);
    ++done;
    if (outcome)
      applied_at_ns = outcome->applied_at_ns;
    else
      error = outcome.error();
  }
};

struct TransportFixture {
  Cluster cluster{config()};
  std::shared_ptr<CutPlan> plan = std::make_shared<CutPlan>();
  ShardLink& link = cluster.open_reconnecting_link(0, plan);
  LinkTransport transport{{&link}};
  std::vector<float> value = std::vector<float>(kElements, 2.f);  // the trainer's memory
  std::vector<float> grad = std::vector<float>(kElements, 1.f);
  VariableId id;

  static DeploymentConfig config() {
    DeploymentConfig c = cluster_config(1, 1, Mode::async);
    c.optimizer.lr = 1.0;
    return c;
  }
  TransportFixture() {
    cluster.run(link.connect(WorkerId(0), ""));
    VariableSpec spec{"w", {kElements}, DType::float32, Priority(0), {}};
    id = cluster.run(
        link.register_part(spec, true, {0, kElements}, std::as_bytes(std::span(value))));
  }
  // Task `n` of step `step` over the elements [begin, end).
  PartitionTask task(uint64_t n, uint64_t step, uint64_t begin, uint64_t end) {
    PartitionTask t;
    t.id = n;
    t.shard = ShardId(0);
    t.partition().variable = id;
    t.partition().step = Step(step);
    t.partition().range = {begin, end};
    t.partition().gradient = std::as_bytes(std::span(grad)).subspan(begin * 4, (end - begin) * 4);
    t.partition().out = reinterpret_cast<std::byte*>(value.data() + begin);
    return t;
  }
  void start(PartitionTask t, Reports& reports) {
    reports.task_id = t.id;
    transport.start(t, reports);
  }
};

}  // namespace

TEST_CASE("a task reports its receipt, its applied time and its end once each") {
  TransportFixture f;
  Reports r;
  f.start(f.task(1, 1, 0, kElements), r);
  f.cluster.run_until([&] { return r.done > 0; });
  f.cluster.settle();
  CHECK(r.receipts == 1);
  CHECK(r.done == 1);
  CHECK_FALSE(r.error);
  CHECK(r.applied_at_ns > 0);
  CHECK(f.value == std::vector<float>(kElements, 1.f));
}

TEST_CASE("partitions lost with their connection are carried again, each applied and ended once") {
  for (uint64_t after : {0ul, 50ul, 100ul}) {
    CAPTURE(after);
    TransportFixture f;
    std::vector<Reports> reports(4);
    f.plan->bytes_left = after;
    for (uint64_t i = 0; i < 4; ++i) f.start(f.task(i, 1, 4 * i, 4 * i + 4), reports[i]);
    f.cluster.run_until([&] {
      for (const Reports& r : reports)
        if (r.done == 0) return false;
      return true;
    });
    f.cluster.settle();
    CHECK(f.plan->cuts == 1);
    for (const Reports& r : reports) {
      CHECK(r.done == 1);
      CHECK(r.receipts == 1);
      CHECK_FALSE(r.error);
    }
    CHECK(f.value == std::vector<float>(kElements, 1.f));  // each update once: 2 - lr 1 x 1
  }
}

TEST_CASE("a refused partition ends with the shard's error and changes nothing") {
  for (bool receipt_first : {false, true}) {
    CAPTURE(receipt_first);
    TransportFixture f;
    f.transport.set_receipt_first(receipt_first);
    Reports refused, good;
    f.start(f.task(1, 3, 0, 4), refused);  // step 3 of a variable at step 0: from the future
    f.start(f.task(2, 1, 4, 8), good);
    f.cluster.run_until([&] { return refused.done > 0 && good.done > 0; });
    f.cluster.settle();
    CHECK(refused.receipts == 0);
    REQUIRE(refused.error);
    CHECK(refused.error->code() == ErrorCode::step_from_future);
    CHECK_FALSE(good.error);
    std::vector<float> expected(kElements, 2.f);
    for (int i = 4; i < 8; ++i) expected[i] = 1.f;
    CHECK(f.value == expected);
    ShardStats stats;
    f.cluster.host().shard(0).stats([&](ShardStats s) { stats = s; });
    f.cluster.settle();
    CHECK(stats.polls_waiting == 0);  // the refused push's poll was withdrawn
  }
}

TEST_CASE("a task for a link whose session is not open fails from inside start") {
  Cluster cluster{TransportFixture::config()};
  ShardLink& link = cluster.open_link(0);  // never connected
  LinkTransport transport{{&link}};
  std::vector<float> grad(4, 1.f), value(4);
  PartitionTask t;
  t.id = 7;
  t.shard = ShardId(0);
  t.partition().step = Step(1);
  t.partition().range = {0, 4};
  t.partition().gradient = std::as_bytes(std::span(grad));
  t.partition().out = reinterpret_cast<std::byte*>(value.data());
  Reports r;
  r.task_id = t.id;
  transport.start(t, r);
  CHECK(r.done == 1);  // before start() returned
  CHECK(r.receipts == 0);
  REQUIRE(r.error);
  CHECK(r.error->code() == ErrorCode::invalid_argument);
  CHECK(std::string(r.error->what()).find("the shard session is not open") != std::string::npos);
}
