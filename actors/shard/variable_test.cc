// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/variable.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include "actors/shard/variable_test_support.h"
#include "common/error.h"
#include "optim/optimizer.h"

using namespace psched;
using psched::testing::code_of;
using psched::testing::sgd_spec;
using psched::testing::Tracked;
using psched::testing::value_of;

namespace {

std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

}  // namespace

TEST_CASE("an async push is applied on arrival and completes the worker's step") {
  std::vector<float> init{1, 2, 3, 4};
  Tracked v(sgd_spec(4), {0, 4}, bytes_of(init), Mode::async, 2);
  std::vector<float> g{1, 1};
  auto applied = v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g)).applied;
  CHECK(applied == std::vector<ElementRange>{{0, 2}});
  CHECK(value_of(v) == std::vector<float>{0, 1, 3, 4});
  CHECK(v.track.applied_step(WorkerId(0)) == Step(0));
  CHECK(v.track.not_yet_applied(WorkerId(0), Step(1), {0, 4}).ranges() ==
        std::vector<ElementRange>{{2, 4}});
  v.push(WorkerId(0), Step(1), {2, 4}, DType::float32, bytes_of(g));
  CHECK(v.track.applied_step(WorkerId(0)) == Step(1));
  CHECK(v.track.not_yet_applied(WorkerId(0), Step(1), {0, 4}).empty());
  CHECK(v.track.applied_step(WorkerId(1)) == Step(0));
}

TEST_CASE("sync mode applies the mean only once every worker pushed the range") {
  std::vector<float> init{0, 0, 0, 0};
  Tracked v(sgd_spec(4), {0, 4}, bytes_of(init), Mode::sync, 2);
  std::vector<float> a{2, 2, 2, 2}, b{4, 4};
  CHECK(v.push(WorkerId(0), Step(1), {0, 4}, DType::float32, bytes_of(a)).applied.empty());
  CHECK(value_of(v) == std::vector<float>{0, 0, 0, 0});
  auto applied = v.push(WorkerId(1), Step(1), {2, 4}, DType::float32, bytes_of(b)).applied;
  CHECK(applied == std::vector<ElementRange>{{2, 4}});
  CHECK(value_of(v) == std::vector<float>{0, 0, -3, -3});
  CHECK(v.track.applied_step(WorkerId(0)) == Step(0));
  v.push(WorkerId(1), Step(1), {0, 2}, DType::float32, bytes_of(b));
  CHECK(value_of(v) == std::vector<float>{-3, -3, -3, -3});
  CHECK(v.track.applied_step(WorkerId(1)) == Step(1));
  SUBCASE("and the next step starts from a clean sum") {
    v.push(WorkerId(0), Step(2), {0, 4}, DType::float32, bytes_of(a));
    v.push(WorkerId(1), Step(2), {0, 4}, DType::float32, bytes_of(a));
    CHECK(value_of(v) == std::vector<float>{-5, -5, -5, -5});
  }
}

TEST_CASE("sync mode averages each element over workers that cut their pushes differently") {
  // Worker w pushes 3 (w + 1) (i + 1) for element i, so every mean is 6 (i + 1), exactly.
  auto gradient = [](uint32_t w, ElementRange r) {
    std::vector<float> g;
    for (uint64_t i = r.begin; i < r.end; ++i) g.push_back(3.0f * float(w + 1) * float(i + 1));
    return g;
  };
  std::vector<float> init(6, 0);
  Tracked v(sgd_spec(6), {0, 6}, bytes_of(init), Mode::sync, 3);
  const std::vector<std::vector<ElementRange>> cuts{
      {{0, 6}}, {{2, 6}, {0, 2}}, {{1, 5}, {0, 1}, {5, 6}}};
  for (uint64_t step = 1; step <= 2; ++step) {
    // The second step pushes in another worker order, over the sums the first one left.
    for (uint32_t k = 0; k < 3; ++k) {
      uint32_t w = step == 1 ? k : 2 - k;
      for (ElementRange r : cuts[w])
        v.push(WorkerId(w), Step(step), r, DType::float32, bytes_of(gradient(w, r)));
    }
    CHECK(v.track.applied_step(WorkerId(0)) == Step(step));
    for (uint64_t i = 0; i < 6; ++i) CHECK(value_of(v)[i] == -6.0f * float(step) * float(i + 1));
  }
}

TEST_CASE("a rejected push leaves the variable untouched") {
  std::vector<float> init{1, 2, 3, 4};
  Tracked v(sgd_spec(4), {0, 4}, bytes_of(init), Mode::async, 1);
  std::vector<float> g{1, 1};
  std::vector<double> wide{1, 1};
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(1), {3, 5}, DType::float32, bytes_of(g));
        }) == ErrorCode::offset_out_of_range);
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(1), {0, 2}, DType::float64, std::as_bytes(std::span(wide)));
        }) == ErrorCode::dtype_mismatch);
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(1), {0, 3}, DType::float32, bytes_of(g));
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(2), {0, 2}, DType::float32, bytes_of(g));
        }) == ErrorCode::step_from_future);
  v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g));
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(1), {1, 3}, DType::float32, bytes_of(g));
        }) == ErrorCode::stale_step);
  CHECK(value_of(v) == std::vector<float>{0, 1, 3, 4});
}

TEST_CASE("a retried push is acknowledged as a duplicate and not applied again") {
  std::vector<float> init{1, 2, 3, 4};
  Tracked v(sgd_spec(4), {0, 4}, bytes_of(init), Mode::async, 1);
  std::vector<float> g{1, 1};
  CHECK_FALSE(v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g)).duplicate);
  CHECK(v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g)).duplicate);
  v.push(WorkerId(0), Step(1), {2, 4}, DType::float32, bytes_of(g));
  // Step 1 is complete now: its retries are duplicates too.
  Tracked::Outcome retry = v.push(WorkerId(0), Step(1), {2, 4}, DType::float32, bytes_of(g));
  CHECK(retry.duplicate);
  CHECK(retry.applied.empty());
  CHECK(value_of(v) == std::vector<float>{0, 1, 2, 3});
}

TEST_CASE("a sync retry after the step completed is a duplicate") {
  std::vector<float> init{0, 0};
  Tracked v(sgd_spec(2), {0, 2}, bytes_of(init), Mode::sync, 2);
  std::vector<float> g{2, 2};
  v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g));
  CHECK(v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g)).duplicate);
  v.push(WorkerId(1), Step(1), {0, 2}, DType::float32, bytes_of(g));
  CHECK(v.push(WorkerId(1), Step(1), {0, 2}, DType::float32, bytes_of(g)).duplicate);
  CHECK(v.track.applied_step(WorkerId(0)) == Step(1));
  CHECK(value_of(v) == std::vector<float>{-2, -2});
}

TEST_CASE("a restored variable continues exactly like the one saved, frozen variance too") {
  VariableSpec spec = sgd_spec(4);
  spec.optimizer.kind = optim::OptimizerKind::adam;
  std::vector<float> init{1, 2, 3, 4};
  constexpr PushedGradient kWhole = PushedGradient::whole, kSparse = PushedGradient::sparse;
  for (Mode mode : {Mode::async, Mode::sync}) {
    Tracked original(spec, {0, 4}, bytes_of(init), mode, 2);
    std::vector<float> g{0.5f, -1, 2, 0.25f}, head{0.5f, -1}, tail{2, 0.25f};
    for (uint32_t w = 0; w < 2; ++w)
      original.push(WorkerId(w), Step(1), {0, 4}, DType::float32, bytes_of(g), kWhole);
    // Step 2 half done, worker 0's push sparse: the tail's update, after the restore, must
    // still freeze the variance (sync), as of step 1's update.
    original.push(WorkerId(0), Step(2), {0, 4}, DType::float32, bytes_of(g), kSparse);
    original.push(WorkerId(1), Step(2), {0, 2}, DType::float32, bytes_of(head), kWhole);
    ByteWriter out;
    original.save(out);
    ByteReader in(out.bytes(), "test");
    Tracked copy = Tracked::restore(in, mode, 2);
    CHECK(in.done());
    for (Tracked* v : {&original, &copy}) {
      v->push(WorkerId(1), Step(2), {2, 4}, DType::float32, bytes_of(tail), kWhole);
      for (uint32_t w = 0; w < 2; ++w)
        v->push(WorkerId(w), Step(3), {0, 4}, DType::float32, bytes_of(g), kSparse);
    }
    CHECK(value_of(copy) == value_of(original));
    CHECK(copy.track.applied_step(WorkerId(0)) == original.track.applied_step(WorkerId(0)));
    CHECK(copy.track.applied_step(WorkerId(1)) == original.track.applied_step(WorkerId(1)));
  }
}

// The value of `init` after adam updates by `grads`, update i (1-based) with the variance
// frozen after frozen[i - 1].
std::vector<float> adam_reference(const VariableSpec& spec, std::vector<float> param,
                                  const std::vector<std::vector<float>>& grads,
                                  const std::vector<uint64_t>& frozen) {
  std::vector<float> m(param.size()), v(param.size());
  std::vector<std::span<float>> state{std::span(m), std::span(v)};
  for (uint64_t t = 1; t <= grads.size(); ++t)
    optim::apply(spec.optimizer, std::span(param), std::span(grads[t - 1]), state, t,
                 frozen[t - 1]);
  return param;
}

TEST_CASE("sparse pushes apply adam with the variance the last whole update left") {
  VariableSpec spec = sgd_spec(2, 0.1);
  spec.optimizer.kind = optim::OptimizerKind::adam;
  std::vector<float> init{1, 2};
  const std::vector<std::vector<float>> grads{{0.5f, -1}, {4, 3}, {-2, 5}, {1, 1}};
  SUBCASE("async: frozen from the first sparse push on, unfrozen by a whole one") {
    Tracked v(spec, {0, 2}, bytes_of(init), Mode::async, 1);
    const std::vector<PushedGradient> kinds{PushedGradient::whole, PushedGradient::sparse,
                                            PushedGradient::sparse, PushedGradient::whole};
    for (uint64_t s = 1; s <= 4; ++s)
      v.push(WorkerId(0), Step(s), {0, 2}, DType::float32, bytes_of(grads[s - 1]), kinds[s - 1]);
    CHECK(value_of(v) == adam_reference(spec, init, grads, {0, 1, 1, 0}));
  }
  SUBCASE("before any whole update there is no variance to freeze") {
    Tracked v(spec, {0, 2}, bytes_of(init), Mode::async, 1);
    v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(grads[0]),
           PushedGradient::sparse);
    CHECK(value_of(v) == adam_reference(spec, init, {grads[0]}, {0}));
  }
  SUBCASE("sync: a range is frozen when any worker's push into it was sparse") {
    Tracked v(spec, {0, 2}, bytes_of(init), Mode::sync, 2);
    for (uint32_t w = 0; w < 2; ++w)
      v.push(WorkerId(w), Step(1), {0, 2}, DType::float32, bytes_of(grads[0]));
    v.push(WorkerId(0), Step(2), {0, 2}, DType::float32, bytes_of(grads[1]),
           PushedGradient::sparse);
    v.push(WorkerId(1), Step(2), {0, 2}, DType::float32, bytes_of(grads[1]));  // whole
    CHECK(value_of(v) == adam_reference(spec, init, {grads[0], grads[1]}, {0, 1}));
  }
}

TEST_CASE("a truncated variable record is refused as corrupt, not misread") {
  std::vector<float> init{1, 2};
  Tracked v(sgd_spec(2), {0, 2}, bytes_of(init), Mode::sync, 2);
  ByteWriter out;
  v.save(out);
  auto bytes = out.bytes();
  bytes.resize(bytes.size() - 3);  // cut short
  ByteReader in(bytes, "cut");
  CHECK(code_of([&] { Tracked::restore(in, Mode::sync, 2); }) == ErrorCode::corrupt_checkpoint);
}

TEST_CASE("a step of a split variable completes when this shard's part is covered") {
  std::vector<float> init{5, 6};
  VariableSpec spec = sgd_spec(10);
  Tracked v(spec, {8, 10}, bytes_of(init), Mode::async, 1);
  std::vector<float> g{1, 1};
  CHECK(code_of([&] {
          v.push(WorkerId(0), Step(1), {0, 2}, DType::float32, bytes_of(g));
        }) == ErrorCode::offset_out_of_range);
  v.push(WorkerId(0), Step(1), {8, 10}, DType::float32, bytes_of(g));
  CHECK(v.track.applied_step(WorkerId(0)) == Step(1));
  CHECK(value_of(v) == std::vector<float>{4, 5});
}

TEST_CASE("a poll for a step beyond the next one is from the future") {
  std::vector<float> init{0};
  Tracked v(sgd_spec(1), {0, 1}, bytes_of(init), Mode::async, 1);
  CHECK(v.track.not_yet_applied(WorkerId(0), Step(0), {0, 1}).empty());
  CHECK(v.track.not_yet_applied(WorkerId(0), Step(1), {0, 1}).size() == 1);
  CHECK(code_of([&] {
          v.track.not_yet_applied(WorkerId(0), Step(2), {0, 1});
        }) == ErrorCode::step_from_future);
}

TEST_CASE("a large update applied on the pool equals the update applied on one thread") {
  uint64_t n = Variable::kParallelApplyElements * 2 + 3;
  VariableSpec spec = sgd_spec(n);
  spec.optimizer.kind = optim::OptimizerKind::adam;
  spec.optimizer.lr = 0.01;
  std::vector<float> init(n), g(n);
  for (uint64_t i = 0; i < n; ++i) {
    init[i] = std::sin(double(i));
    g[i] = std::cos(double(i) * 0.37);
  }
  ForkJoinPool pool(2);
  Tracked parallel(spec, {0, n}, bytes_of(init), Mode::async, 1, &pool);
  Tracked single(spec, {0, n}, bytes_of(init), Mode::async, 1);
  for (uint64_t s = 1; s <= 3; ++s) {
    parallel.push(WorkerId(0), Step(s), {0, n}, DType::float32, bytes_of(g));
    single.push(WorkerId(0), Step(s), {0, n}, DType::float32, bytes_of(g));
  }
  auto a = value_of(parallel), b = value_of(single);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  CHECK(a != init);
}
