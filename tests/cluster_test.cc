// SPDX-License-Identifier: Apache-2.0
// End-to-end semantics on the simulated cluster: sync aggregation, async hand-off, priority
// order and the credit window, through real RPC.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <doctest/doctest.h>

#include "common/error.h"
#include "net/wire_convert.h"
#include "tests/cluster.h"

using namespace psched;
using namespace psched::testing;

namespace {

// A variable of the test model, with the trainer-side memory each worker keeps for it.
struct TestVariable {
  std::string name;
  uint64_t elements;
  DType dtype;
};

const std::vector<TestVariable> kModel = {
    {"l1/w", 300, DType::float32},  // split across both shards
    {"l1/b", 7, DType::float32},
    {"l2/w", 100, DType::float64},  // split
    {"l2/b", 3, DType::float64},
};

std::vector<std::byte> random_bytes(const TestVariable& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<std::byte> out(v.elements * element_bytes(v.dtype));
  visit_dtype(v.dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* p = reinterpret_cast<T*>(out.data());
    for (uint64_t i = 0; i < v.elements; ++i) p[i] = static_cast<T>(normal(rng));
  });
  return out;
}

uint64_t grad_seed(uint32_t worker, uint64_t step, size_t variable) {
  return 1'000'000 + worker * 10'000 + step * 100 + variable;
}

optim::OptimizerSpec adam() {
  optim::OptimizerSpec spec;
  spec.kind = optim::OptimizerKind::adam;
  spec.lr = 0.05;
  spec.weight_decay = 0.01;
  return spec;
}

// The sync-mode result computed directly: per step, the mean of every worker's gradient,
// applied with the optimizer kernel to the whole variable.
std::vector<std::byte> sequential_reference(size_t v, uint32_t workers, uint64_t steps) {
  const TestVariable& var = kModel[v];
  std::vector<std::byte> value = random_bytes(var, v);
  visit_dtype(var.dtype, [&](auto zero) {
    using T = decltype(zero);
    optim::OptimizerSpec spec = adam();
    std::vector<std::vector<T>> slots(optim::state_slots(spec), std::vector<T>(var.elements));
    std::vector<std::span<T>> state(slots.begin(), slots.end());
    auto param = std::span(reinterpret_cast<T*>(value.data()), var.elements);
    for (uint64_t s = 1; s <= steps; ++s) {
      std::vector<T> mean(var.elements, T(0));
      for (uint32_t w = 0; w < workers; ++w) {
        auto g = random_bytes(var, grad_seed(w, s, v));
        for (uint64_t i = 0; i < var.elements; ++i) mean[i] += reinterpret_cast<T*>(g.data())[i];
      }
      for (T& m : mean) m *= T(1) / static_cast<T>(workers);
      optim::apply(spec, param, std::span<const T>(mean), state, s);
    }
  });
  return value;
}

void check_close(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                 DType dtype) {
  REQUIRE(got.size() == want.size());
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* a = reinterpret_cast<const T*>(got.data());
    auto* b = reinterpret_cast<const T*>(want.data());
    for (size_t i = 0; i < got.size() / sizeof(T); ++i) {
      // Shards sum the workers' gradients in arrival order; the reference in worker order.
      double tolerance = 1e-6 * std::max(1.0, std::abs(double(b[i])));
      CHECK_MESSAGE(std::abs(double(a[i]) - double(b[i])) <= tolerance, "element ", i);
    }
  });
}

struct TrainedWorker {
  Worker* worker;
  std::vector<std::vector<std::byte>> values;  // trainer memory, per variable
  std::vector<VariableHandle> handles;
};

// Registers kModel on `worker` with adam and each variable's seeded initial value.
TrainedWorker register_model(Cluster& cluster, Worker& worker) {
  TrainedWorker t{&worker, {}, {}};
  for (size_t v = 0; v < kModel.size(); ++v) t.values.push_back(random_bytes(kModel[v], v));
  for (size_t v = 0; v < kModel.size(); ++v) {
    VariableSpec spec{
        kModel[v].name, {kModel[v].elements}, kModel[v].dtype, static_cast<Priority>(v), adam()};
    t.handles.push_back(cluster.run(worker.register_variable(spec, t.values[v], false)));
  }
  return t;
}

// Every worker pushes every variable (backward order) for steps 1..steps, waiting for all
// fresh values before the next step, as a trainer's forward pass would.
void train(Cluster& cluster, std::vector<TrainedWorker>& workers, uint64_t steps) {
  for (uint64_t s = 1; s <= steps; ++s) {
    std::vector<std::vector<std::byte>> grads;
    size_t done = 0, expected = 0;
    for (uint32_t w = 0; w < workers.size(); ++w)
      for (size_t v = 0; v < kModel.size(); ++v)
        grads.push_back(random_bytes(kModel[v], grad_seed(w, s, v)));
    for (uint32_t w = 0; w < workers.size(); ++w) {
      for (size_t v = kModel.size(); v-- > 0;) {
        ++expected;
        workers[w].worker->push(workers[w].handles[v], Step(s), grads[w * kModel.size() + v],
                                [&done](std::exception_ptr error) {
                                  REQUIRE_FALSE(error);
                                  ++done;
                                });
      }
    }
    cluster.run_until([&] { return done == expected; });
  }
}

std::vector<TrainedWorker> start_sync_cluster(Cluster& cluster, uint32_t workers,
                                              SchedulerConfig scheduler) {
  std::vector<TrainedWorker> out;
  for (uint32_t w = 0; w < workers; ++w)
    out.push_back(register_model(cluster, cluster.add_worker(WorkerId(w), scheduler)));
  return out;
}

SchedulerConfig small_windows(SchedulePolicy policy) {
  SchedulerConfig s;
  s.policy = policy;
  s.partition_bytes = 64;
  s.credit_bytes = 256;
  return s;
}

DeploymentConfig split_config(Mode mode, uint32_t workers) {
  DeploymentConfig config = cluster_config(2, workers, mode);
  config.split_bytes = 256;  // l1/w and l2/w are split across both shards
  return config;
}

std::vector<std::vector<std::byte>> sync_run(SchedulePolicy policy) {
  Cluster cluster(split_config(Mode::sync, 3));
  auto workers = start_sync_cluster(cluster, 3, small_windows(policy));
  train(cluster, workers, 4);
  return workers[0].values;
}

}  // namespace

TEST_CASE("sync mode on 2 shards and 3 workers equals the sequential reference") {
  Cluster cluster(split_config(Mode::sync, 3));
  auto workers = start_sync_cluster(cluster, 3, small_windows(SchedulePolicy::priority));
  train(cluster, workers, 5);
  for (size_t v = 0; v < kModel.size(); ++v) {
    auto reference = sequential_reference(v, 3, 5);
    for (auto& w : workers) check_close(w.values[v], reference, kModel[v].dtype);
  }
}

TEST_CASE("priority and fifo scheduling give the same final parameters in sync mode") {
  auto scheduled = sync_run(SchedulePolicy::priority);
  auto fifo = sync_run(SchedulePolicy::fifo);
  for (size_t v = 0; v < kModel.size(); ++v) check_close(scheduled[v], fifo[v], kModel[v].dtype);
}

TEST_CASE("in async mode a worker's poll returns after its own update, not the others'") {
  DeploymentConfig config = split_config(Mode::async, 2);
  config.optimizer.lr = 1.0;  // sgd: value -= gradient
  Cluster cluster(config);
  SchedulerConfig scheduler = small_windows(SchedulePolicy::priority);
  Worker& a = cluster.add_worker(WorkerId(0), scheduler);
  Worker& b = cluster.add_worker(WorkerId(1), scheduler);
  std::vector<float> va(300, 1.f), vb(300, 1.f);
  VariableSpec spec{"w", {300}, DType::float32, Priority(0), {}};
  auto ha = cluster.run(a.register_variable(spec, std::as_writable_bytes(std::span(va)), true));
  auto hb = cluster.run(b.register_variable(spec, std::as_writable_bytes(std::span(vb)), true));

  std::vector<float> ga(300, 0.25f), gb(300, 0.5f);
  bool a_done = false, b_done = false;
  a.push(ha, Step(1), std::as_bytes(std::span(ga)), [&](std::exception_ptr e) { a_done = !e; });
  cluster.run_until([&] { return a_done; });
  CHECK(va == std::vector<float>(300, 0.75f));  // worker 1 never pushed: no wait for it
  CHECK(vb == std::vector<float>(300, 1.f));

  b.push(hb, Step(1), std::as_bytes(std::span(gb)), [&](std::exception_ptr e) { b_done = !e; });
  cluster.run_until([&] { return b_done; });
  CHECK(vb == std::vector<float>(300, 0.25f));  // both updates applied, Hogwild-style
  cluster.run(a.pull(ha));
  CHECK(va == vb);
}

TEST_CASE("fresh values of 64 KiB and more, sent from the variable's memory, arrive exact") {
  // Partitions of 64 KiB go back as references to the shard's variable (server/shard_service.cc);
  // the one-element tail is copied. Two steps, so the second answer reflects the first.
  DeploymentConfig config = cluster_config(1, 1, Mode::async);
  config.optimizer.lr = 1.0;  // sgd: value -= gradient
  Cluster cluster(config);
  SchedulerConfig scheduler;
  scheduler.partition_bytes = 64 << 10;
  scheduler.credit_bytes = 4 << 20;
  Worker& w = cluster.add_worker(WorkerId(0), scheduler);
  constexpr size_t kElements = 3 * (64 << 10) / 4 + 1;
  std::vector<float> value(kElements, 2.f), grad(kElements), expected(kElements, 2.f);
  for (size_t i = 0; i < kElements; ++i) grad[i] = float(i % 1000) / 1024;
  VariableSpec spec{"big", {kElements}, DType::float32, Priority(0), {}};
  auto h = cluster.run(w.register_variable(spec, std::as_writable_bytes(std::span(value)), true));
  for (uint64_t step = 1; step <= 2; ++step) {
    bool done = false;
    w.push(h, Step(step), std::as_bytes(std::span(grad)), [&](std::exception_ptr e) { done = !e; });
    cluster.run_until([&] { return done; });
    for (size_t i = 0; i < kElements; ++i) expected[i] -= grad[i];
    CHECK(value == expected);
  }
}

TEST_CASE("partitions start in priority order up to the credit and never exceed it") {
  Cluster cluster(split_config(Mode::async, 1));
  SchedulerConfig scheduler;
  scheduler.partition_bytes = 128;  // 32 floats
  scheduler.credit_bytes = 256;     // two partitions in flight
  Worker& worker = cluster.add_worker(WorkerId(0), scheduler);
  constexpr size_t kLayers = 6;
  std::vector<std::vector<float>> values(kLayers, std::vector<float>(64, 0.f));
  std::vector<float> grad(64, 1.f);
  std::vector<VariableHandle> handles;
  for (size_t l = 0; l < kLayers; ++l) {
    VariableSpec spec{
        "layer" + std::to_string(l), {64}, DType::float32, static_cast<Priority>(l), {}};
    handles.push_back(cluster.run(
        worker.register_variable(spec, std::as_writable_bytes(std::span(values[l])), true)));
  }
  // Backward pass: the last layer's gradient is ready first.
  size_t done = 0;
  for (size_t l = kLayers; l-- > 0;)
    worker.push(handles[l], Step(1), std::as_bytes(std::span(grad)),
                [&](std::exception_ptr e) { done += !e; });
  cluster.run_until([&] { return done == kLayers; });

  std::vector<TaskRecord> records;
  worker.scheduler().take_records([&](std::vector<TaskRecord> r) { records = std::move(r); });
  SchedulerStats stats;
  worker.scheduler().stats([&](SchedulerStats s) { stats = s; });
  cluster.settle();
  REQUIRE(records.size() == 2 * kLayers);
  std::sort(records.begin(), records.end(),
            [](auto& a, auto& b) { return a.start_index < b.start_index; });
  // The last layer took the idle link; then the window drains strictly by priority.
  std::vector<int64_t> expected{5, 5, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4};
  for (size_t i = 0; i < records.size(); ++i) CHECK(records[i].priority.value == expected[i]);
  for (uint64_t most : {stats.max_push_bytes_in_flight, stats.max_pull_bytes_in_flight}) {
    CHECK(most <= scheduler.credit_bytes);
    CHECK(most == scheduler.credit_bytes);
  }
}

TEST_CASE("bytes in flight never exceed the credit with three workers and random sizes") {
  Cluster cluster(split_config(Mode::sync, 3));
  SchedulerConfig scheduler = small_windows(SchedulePolicy::priority);
  scheduler.partition_bytes = 40;
  scheduler.credit_bytes = 120;
  auto workers = start_sync_cluster(cluster, 3, scheduler);
  train(cluster, workers, 3);
  for (auto& w : workers) {
    SchedulerStats stats;
    w.worker->scheduler().stats([&](SchedulerStats s) { stats = s; });
    cluster.settle();
    CHECK(stats.max_push_bytes_in_flight <= scheduler.credit_bytes);
    CHECK(stats.max_pull_bytes_in_flight <= scheduler.credit_bytes);
    CHECK(stats.push_bytes_in_flight == 0);
    CHECK(stats.pull_bytes_in_flight == 0);
    CHECK(stats.finished_tasks == stats.started_tasks);
  }
}

TEST_CASE("sync workers whose gradients become ready in different orders do not deadlock") {
  // Credit for one partition each. Worker 0 starts layer B before layer A is ready; worker 1
  // has both ready and starts A first. If a sync poll held its credit until the aggregate came
  // back, worker 0 would wait for worker 1's B and worker 1 for worker 0's A, forever.
  DeploymentConfig config = cluster_config(1, 2, Mode::sync);
  config.optimizer.lr = 0.5;  // sgd: 1 - 0.5 * mean(1, 1) = 0.5 exactly
  Cluster cluster(config);
  SchedulerConfig scheduler;
  scheduler.partition_bytes = 64;
  scheduler.credit_bytes = 64;
  Worker& w0 = cluster.add_worker(WorkerId(0), scheduler);
  Worker& w1 = cluster.add_worker(WorkerId(1), scheduler);
  std::vector<std::vector<float>> values(4, std::vector<float>(16, 1.f));
  std::vector<float> grad(16, 1.f);
  auto add = [&](Worker& w, const std::string& name, int64_t priority, size_t memory) {
    VariableSpec spec{name, {16}, DType::float32, Priority(priority), {}};
    return cluster.run(
        w.register_variable(spec, std::as_writable_bytes(std::span(values[memory])), true));
  };
  VariableHandle a0 = add(w0, "A", 0, 0), b0 = add(w0, "B", 1, 1);
  VariableHandle a1 = add(w1, "A", 0, 2), b1 = add(w1, "B", 1, 3);
  size_t done = 0;
  auto count = [&](std::exception_ptr e) { done += !e; };
  w0.push(b0, Step(1), std::as_bytes(std::span(grad)), count);
  cluster.settle();  // worker 0's B is in flight, waiting for worker 1's B
  w1.push(a1, Step(1), std::as_bytes(std::span(grad)), count);
  w1.push(b1, Step(1), std::as_bytes(std::span(grad)), count);
  cluster.settle();
  w0.push(a0, Step(1), std::as_bytes(std::span(grad)), count);
  cluster.run_until([&] { return done == 4; });
  for (auto& v : values) CHECK(v == std::vector<float>(16, 0.5f));
}

TEST_CASE("a first-layer answer overtakes last-layer answers queued on a busy connection") {
  // Sync mode: worker 0's polls wait for worker 1. Worker 0 stops reading; worker 1 completes
  // the last layer (32 answers of 64 KiB for worker 0, more than the connection's 1 MiB
  // window), then the first layer. Worker 0's first-layer value must come back before the
  // last layer's is complete, not behind all of it.
  DeploymentConfig config = cluster_config(1, 2, Mode::sync);
  Cluster cluster(config);
  SchedulerConfig scheduler;
  scheduler.partition_bytes = 64 << 10;
  scheduler.credit_bytes = 4 << 20;
  Worker& w0 = cluster.add_worker(WorkerId(0), scheduler);
  Worker& w1 = cluster.add_worker(WorkerId(1), scheduler);
  constexpr uint64_t kLast = 32 * (64 << 10) / 4, kFirst = (64 << 10) / 4;
  std::vector<std::vector<float>> memory = {std::vector<float>(kLast), std::vector<float>(kFirst),
                                            std::vector<float>(kLast), std::vector<float>(kFirst)};
  auto add = [&](Worker& w, const std::string& name, int64_t priority, size_t m) {
    VariableSpec spec{name, {memory[m].size()}, DType::float32, Priority(priority), {}};
    return cluster.run(
        w.register_variable(spec, std::as_writable_bytes(std::span(memory[m])), true));
  };
  VariableHandle last0 = add(w0, "last", 9, 0), first0 = add(w0, "first", 0, 1);
  VariableHandle last1 = add(w1, "last", 9, 2), first1 = add(w1, "first", 0, 3);
  std::vector<float> grad(kLast, 1.f);
  auto bytes = [&](uint64_t n) { return std::as_bytes(std::span(grad.data(), n)); };
  std::vector<std::string> finished;  // worker 0's pushes, in the order they completed
  size_t others = 0;
  w0.push(last0, Step(1), bytes(kLast), [&](std::exception_ptr) { finished.push_back("last"); });
  w0.push(first0, Step(1), bytes(kFirst), [&](std::exception_ptr) { finished.push_back("first"); });
  cluster.settle();  // both pushed and receipted; their polls wait for worker 1
  auto plan = cluster.cut(0, 0, CutPlan::kNever);
  auto resume = kj::newPromiseAndFulfiller<void>();
  plan->reads_held = resume.promise.fork();
  w1.push(last1, Step(1), bytes(kLast), [&](std::exception_ptr) { ++others; });
  cluster.settle();  // worker 0's last-layer answers are ready; the connection backs up
  w1.push(first1, Step(1), bytes(kFirst), [&](std::exception_ptr) { ++others; });
  cluster.settle();
  resume.fulfiller->fulfill();
  cluster.run_until([&] { return finished.size() == 2 && others == 2; });
  plan->reads_held = nullptr;
  CHECK(finished == std::vector<std::string>{"first", "last"});
}

namespace {

ErrorCode code_of_rejection(const std::function<void()>& run) {
  try {
    run();
  } catch (const kj::Exception& e) {
    return from_kj_exception(e).code();
  }
  FAIL("no rejection");
  return ErrorCode::internal;
}

}  // namespace

TEST_CASE("a worker's rejections keep the error code, from the shard or from its own checks") {
  DeploymentConfig config = cluster_config(2, 2, Mode::async);
  config.limits.max_message_bytes = 1 << 20;
  Cluster cluster(config);
  SchedulerConfig too_big;
  too_big.partition_bytes = 2 << 20;  // over the shards' message limit: refused on connect
  CHECK(code_of_rejection([&] { cluster.add_worker(WorkerId(0), too_big); }) ==
        ErrorCode::bad_config);

  Worker& worker = cluster.add_worker(WorkerId(1), SchedulerConfig{});
  std::vector<float> a(4), b(8);
  VariableSpec spec{"w", {4}, DType::float32, Priority(0), {}};
  cluster.run(worker.register_variable(spec, std::as_writable_bytes(std::span(a)), true));
  spec.shape = {8};
  CHECK(code_of_rejection([&] {
          cluster.run(worker.register_variable(spec, std::as_writable_bytes(std::span(b)), true));
        }) == ErrorCode::spec_conflict);
}
