// SPDX-License-Identifier: Apache-2.0
// Faults on the simulated cluster: connections cut in the middle of messages. Workers
// reconnect, resend what was lost, and the shards apply every push exactly once, so the final
// values equal those of a run without faults, bit for bit.
#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 40'000;  // 160 KB: ten 16 KiB partitions
constexpr uint64_t kSteps = 4;

std::vector<float> gradient(uint32_t worker, uint64_t step) {
  std::vector<float> g(kElements);
  for (uint64_t i = 0; i < kElements; ++i)
    g[i] = std::sin(0.37f * float(worker) + 1.3f * float(step) + 0.01f * float(i));
  return g;
}

struct Cut {
  Step before_step;  // Step(): no cut
  size_t worker = 0;
  uint64_t after_bytes = 0;
};

struct TrainedRun {
  std::vector<float> value;  // worker 0's memory after the last step
  uint64_t cuts = 0;
  uint64_t open_streams = 0;  // the cut link's streams still open at the end
  ShardStats shard;
};

// Trains one variable (sgd, so results are exact) on `workers` workers for kSteps steps,
// cutting a connection as `cut` says.
TrainedRun train(Mode mode, uint32_t workers, SchedulerConfig scheduler, Cut cut) {
  Cluster cluster(cluster_config(1, workers, mode));
  std::vector<Worker*> team;
  std::vector<std::vector<float>> memory(workers, std::vector<float>(kElements, 0.f));
  std::vector<VariableHandle> handles;
  VariableSpec spec;
  spec.name = "w";
  spec.shape = {kElements};
  spec.optimizer.lr = 0.1;
  for (uint32_t w = 0; w < workers; ++w) {
    team.push_back(&cluster.add_worker(WorkerId(w), scheduler));
    handles.push_back(cluster.run(
        team[w]->register_variable(spec, std::as_writable_bytes(std::span(memory[w])), false)));
  }
  std::shared_ptr<CutPlan> plan;
  for (uint64_t i = 1; i <= kSteps; ++i) {
    Step s(i);
    if (s == cut.before_step) plan = cluster.cut(cut.worker, 0, cut.after_bytes);
    std::vector<std::vector<float>> grads;
    size_t done = 0;
    for (uint32_t w = 0; w < workers; ++w) grads.push_back(gradient(w, i));
    for (uint32_t w = 0; w < workers; ++w)
      team[w]->push(handles[w], s, std::as_bytes(std::span(grads[w])),
                    [&done](std::exception_ptr error) {
                      if (error) std::rethrow_exception(error);
                      ++done;
                    });
    cluster.run_until([&] { return done == workers; });
  }
  TrainedRun out{memory[0], plan ? plan->cuts : 0, plan ? plan->open : 0, {}};
  cluster.host().shard(0).stats([&](ShardStats s) { out.shard = s; });
  cluster.settle();
  return out;
}

SchedulerConfig partitions_of(uint64_t bytes) {
  SchedulerConfig s;
  s.partition_bytes = bytes;
  s.credit_bytes = 64 << 10;
  return s;
}

}  // namespace

TEST_CASE("a connection cut anywhere in a push is resumed and each push applied once (async)") {
  SchedulerConfig scheduler = partitions_of(16 << 10);
  TrainedRun reference = train(Mode::async, 1, scheduler, {});
  for (uint64_t after : {0ul, 100ul, 3'000ul, 17'000ul, 40'000ul, 100'000ul}) {
    CAPTURE(after);
    TrainedRun faulty = train(Mode::async, 1, scheduler, {Step(2), 0, after});
    CHECK(faulty.cuts == 1);
    CHECK(faulty.value == reference.value);
    CHECK(faulty.shard.partitions_applied == reference.shard.partitions_applied);
    // The lost streams were closed, not kept: the connection (and its data stream) remain.
    CHECK(faulty.open_streams == (default_data_path() == DataPathKind::stream ? 2 : 1));
  }
}

TEST_CASE("a sync step waits for a cut worker's resent pushes and applies each once") {
  SchedulerConfig scheduler = partitions_of(16 << 10);
  TrainedRun reference = train(Mode::sync, 2, scheduler, {});
  for (uint64_t after : {50ul, 20'000ul, 90'000ul}) {
    for (size_t worker : {0ul, 1ul}) {
      CAPTURE(after);
      CAPTURE(worker);
      TrainedRun faulty = train(Mode::sync, 2, scheduler, {Step(3), worker, after});
      CHECK(faulty.cuts == 1);
      CHECK(faulty.value == reference.value);
    }
  }
}

TEST_CASE("many small partitions in flight when their connection is cut are resent, each once") {
  // Sync mode sends each partition's push and poll apart (receipts first): a partition whose
  // push was lost with the connection is carried again after the reconnect, not failed.
  SchedulerConfig scheduler = partitions_of(4 << 10);
  for (Mode mode : {Mode::async, Mode::sync}) {
    uint32_t workers = mode == Mode::sync ? 2 : 1;
    TrainedRun reference = train(mode, workers, scheduler, {});
    for (uint64_t after : {500ul, 10'000ul, 33'000ul}) {
      CAPTURE(mode);
      CAPTURE(after);
      TrainedRun faulty = train(mode, workers, scheduler, {Step(2), 0, after});
      CHECK(faulty.cuts == 1);
      CHECK(faulty.value == reference.value);
    }
  }
}

TEST_CASE("a push whose answer was lost is acknowledged as a duplicate when resent") {
  // Cuts around the end of step 2's first push message (16 KiB of data plus Cap'n Proto
  // framing): some land in the poll sent right behind it, so the shard applied the push but
  // its answer never came back.
  SchedulerConfig scheduler = partitions_of(16 << 10);
  TrainedRun reference = train(Mode::async, 1, scheduler, {});
  uint64_t duplicates = 0;
  for (uint64_t after = 16'384; after < 16'900; after += 24) {
    CAPTURE(after);
    TrainedRun faulty = train(Mode::async, 1, scheduler, {Step(2), 0, after});
    CHECK(faulty.cuts == 1);
    CHECK(faulty.value == reference.value);
    duplicates += faulty.shard.pushes_duplicate;
  }
  CHECK(duplicates > 0);
}
