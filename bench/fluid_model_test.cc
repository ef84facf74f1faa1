// SPDX-License-Identifier: Apache-2.0
#include "bench/fluid_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include <doctest/doctest.h>

namespace psched::bench {
namespace {

constexpr double kTolerance = 1e-9;  // relative

doctest::Approx near(double expected) {
  return doctest::Approx(expected).epsilon(kTolerance);
}

double total_bytes(const std::vector<FluidLayer>& layers) {
  double total = 0;
  for (const FluidLayer& l : layers) total += l.bytes;
  return total;
}

TEST_CASE("under priority one layer's value comes down while its gradient goes up") {
  // fwd [0,2], bwd [2,5], up 10 B / 5 B/s = [5,7]. Each byte may come down as soon as it is
  // up, so v follows g at the same rate with no backlog: down [5,7] too, ending with the
  // upstream. The next forward starts at 7 = fwd + bwd + bytes / rate.
  std::vector<FluidLayer> layers = {{2, 3, 10}};
  FluidResult r = simulate_fluid(layers, 5, FluidPolicy::priority, 10);
  CHECK(r.iteration_s == near(7));
  CHECK(r.compute_s == near(5));
  REQUIRE(r.iteration_starts.size() == 11);
  for (size_t k = 0; k < r.iteration_starts.size(); ++k) {
    CHECK(r.iteration_starts[k] == near(7.0 * double(k)));
  }
  CHECK(r.upstream_busy_s == near(10 * 2));  // 10 iterations x 2 s
  CHECK(r.downstream_busy_s == near(10 * 2));
  CHECK(r.finish_s == near(70));  // the 10th fresh value is back at 7 x 10
}

TEST_CASE("one layer takes forward + backward + its bytes up + its bytes down") {
  // fwd [0,2], bwd [2,5], up 10 B / 5 B/s = [5,7], down [7,9]; the next forward starts at 9.
  std::vector<FluidLayer> layers = {{2, 3, 10}};
  for (FluidPolicy policy : {FluidPolicy::fifo}) {
    CAPTURE(to_string(policy));
    FluidResult r = simulate_fluid(layers, 5, policy, 10);
    CHECK(r.iteration_s == near(9));
    CHECK(r.compute_s == near(5));
    REQUIRE(r.iteration_starts.size() == 11);
    for (size_t k = 0; k < r.iteration_starts.size(); ++k) {
      CHECK(r.iteration_starts[k] == near(9.0 * double(k)));
    }
    CHECK(r.upstream_busy_s == near(10 * 2));  // 10 iterations x 2 s
    CHECK(r.downstream_busy_s == near(10 * 2));
    CHECK(r.finish_s == near(90));  // the 10th fresh value is back at 9 x 10
  }
}

TEST_CASE("an infinitely fast link gives the compute-only time") {
  std::vector<FluidLayer> layers = {{0.5, 1.0, 4e6}, {0.25, 0.75, 1e9}, {1.5, 2.0, 0}};
  double inf = std::numeric_limits<double>::infinity();
  for (FluidPolicy policy : {FluidPolicy::priority, FluidPolicy::fifo}) {
    CAPTURE(to_string(policy));
    FluidResult r = simulate_fluid(layers, inf, policy, 6);
    CHECK(r.compute_s == near(6));  // 0.5 + 1 + 0.25 + 0.75 + 1.5 + 2
    CHECK(r.iteration_s == near(6));
    CHECK(r.iteration_starts.back() == near(36));
    CHECK(r.upstream_busy_s == 0);
    CHECK(r.downstream_busy_s == 0);
  }
}

// Two layers, fwd = bwd = 1 s each, 2 B and 4 B over 1 B/s.
const std::vector<FluidLayer> kTwoLayers = {{1, 1, 2}, {1, 1, 4}};

TEST_CASE("under priority the first layer's gradient preempts the second's") {
  // Downstream follows upstream byte for byte: each direction runs at 1 B/s, so the layer
  // being sent up is also the one being sent down, with no backlog, and v_i is back the
  // instant g_i's last byte is up.
  // Iteration 1: F1 [0,1] F2 [1,2] B2 [2,3] B1 [3,4].
  //   g2 and v2 [3,4): 1 B of 4 each way. At 4 g1 preempts upstream, and v1 (lower layer,
  //   no backlog) takes the downstream: g1 and v1 [4,6], 2 B / 1 B/s; v1 back at 6.
  //   g2 and v2 resume [6,9] (the 3 B left); v2 back at 9.
  // Iteration 2 starts at max(B1 ends 4, v1 back 6) = 6: F1 [6,7]; F2 waits for v2 (9):
  //   [9,10], B2 [10,11], B1 [11,12]. g2/v2 [11,12) 1 B; g1/v1 [12,14]; g2/v2 [14,17] 3 B.
  // Iteration 3 starts at max(12, 14) = 14. From iteration 2 on every iteration takes 8 s:
  //   start S, F1 [S,S+1], v2 of the previous iteration back at S+3, F2 [S+3,S+4],
  //   B2 [S+4,S+5], B1 [S+5,S+6]; g2/v2 [S+5,S+6) 1 B, g1/v1 [S+6,S+8]: the next start is S+8;
  //   g2/v2's last 3 B [S+8,S+11] = the next S+3.
  // Store and forward (a value going down only once its whole gradient is up) took 12 s here.
  // The bounds: compute-only 4 s, all bytes up 6 s.
  FluidResult r = simulate_fluid(kTwoLayers, 1, FluidPolicy::priority, 10);
  REQUIRE(r.iteration_starts.size() == 11);
  CHECK(r.iteration_starts[0] == near(0));
  for (size_t k = 1; k < r.iteration_starts.size(); ++k) {
    CHECK(r.iteration_starts[k] == near(6 + 8.0 * double(k - 1)));
  }
  CHECK(r.iteration_s == near(8));
  CHECK(r.upstream_busy_s == near(10 * 6));  // 10 iterations x 6 B / 1 B/s
  CHECK(r.downstream_busy_s == near(10 * 6));
  // v2 of iteration 10 (which starts at 6 + 8 x 8 = 70) is back at iteration 11's S + 3.
  CHECK(r.finish_s == near(78 + 3));
}

TEST_CASE("fifo sends the two-layer profile whole and in arrival order") {
  // Iteration 1: B2 ends 3, B1 ends 4. up g2 [3,7], g1 [7,9]; down v2 [7,11], v1 waits for
  //   the link: [11,13]. Iteration 2 starts at 13; v2 (at 11) is already back for F2.
  // Every iteration: start S, B1 ends S+4, g2 [S+3,S+7], g1 [S+7,S+9], v2 [S+7,S+11],
  //   v1 [S+11,S+13]: 13 s, 5 s more than priority.
  FluidResult r = simulate_fluid(kTwoLayers, 1, FluidPolicy::fifo, 10);
  for (size_t k = 0; k < r.iteration_starts.size(); ++k) {
    CHECK(r.iteration_starts[k] == near(13.0 * double(k)));
  }
  CHECK(r.iteration_s == near(13));
}

TEST_CASE("fifo is strictly worse than priority when the first layer's value comes back last") {
  // Three layers, fwd 2 s, bwd 0 s, 1 B each over 1 B/s; compute-only 6 s. The three
  // gradients become ready together at the end of the forward pass (bwd takes no time).
  // priority: up g1 [S+6,S+7], g2 [S+7,S+8], g3 [S+8,S+9], each value coming down with its
  //   gradient: v1, v2, v3 back at S+7, S+8, S+9. The next start is S+7; F2 starts at S+9
  //   (v2 back at S+8) and F3 at S+11 (v3 back at S+9), so nothing waits: 7 s per iteration.
  // fifo: up in arrival order g3, g2, g1 ending S+7, S+8, S+9; down v3, v2, v1 ending S+8,
  //   S+9, S+10. The next start is S+10: 10 s per iteration, 3 s worse.
  std::vector<FluidLayer> layers = {{2, 0, 1}, {2, 0, 1}, {2, 0, 1}};
  FluidResult priority = simulate_fluid(layers, 1, FluidPolicy::priority, 10);
  FluidResult fifo = simulate_fluid(layers, 1, FluidPolicy::fifo, 10);
  CHECK(priority.iteration_s == near(7));
  CHECK(fifo.iteration_s == near(10));
  CHECK(fifo.iteration_s - priority.iteration_s == near(3));
  CHECK(priority.iteration_starts[1] == near(7));
  CHECK(fifo.iteration_starts[1] == near(10));
}

TEST_CASE("with no compute fifo takes every byte up plus the last layer's down") {
  // Three layers of 2 B over 1 B/s, no compute. All gradients ready at once; up g1, g2, g3 take
  // 2 s each; v_i goes down right after g_i, so v3 is back 4 s after g3 left: 4 x 2 s = 8 s.
  std::vector<FluidLayer> layers = {{0, 0, 2}, {0, 0, 2}, {0, 0, 2}};
  CHECK(simulate_fluid(layers, 1, FluidPolicy::fifo).iteration_s == near(8));
}

TEST_CASE("with no compute priority reaches the bound of every byte up once") {
  // The same three layers. Each value comes down with its gradient: v1, v2, v3 are back 2, 4,
  // 6 s after the gradients were ready. Start S: F1 at S, F2 waits for v2 until S+2, F3 for v3
  // until S+4; the backward ends at S+4, all three gradients go up [S+4,S+10] and v1 is back
  // at S+6: 6 s per iteration = total bytes / rate, the lower bound, reached exactly.
  std::vector<FluidLayer> layers = {{0, 0, 2}, {0, 0, 2}, {0, 0, 2}};
  FluidResult r = simulate_fluid(layers, 1, FluidPolicy::priority);
  CHECK(r.iteration_s == near(6));
  CHECK(r.iteration_s == near(total_bytes(layers) / 1));
}

TEST_CASE("over a very slow link the iteration approaches the upstream bound") {
  // 50 equal layers: the upstream must carry every byte each iteration (lower bound); at most
  // one layer's downstream and the compute do not overlap with it (upper bound). The bound is
  // within 1/50 + 1e-6 of total bytes / rate here.
  std::vector<FluidLayer> layers(50, FluidLayer{1e-3, 2e-3, 1e6});
  double rate = total_bytes(layers) / (1e6 * compute_only_s(layers));  // upstream = 1e6 x compute
  double upstream_s = total_bytes(layers) / rate;
  for (FluidPolicy policy : {FluidPolicy::priority, FluidPolicy::fifo}) {
    CAPTURE(to_string(policy));
    double iteration = simulate_fluid(layers, rate, policy).iteration_s;
    CHECK(iteration >= upstream_s * (1 - kTolerance));
    CHECK(iteration <= (upstream_s + 1e6 / rate + compute_only_s(layers)) * (1 + kTolerance));
  }
}

TEST_CASE("a faster link never makes a priority iteration slower") {
  std::mt19937 random(20240611);  // seeded: the same profile every run
  std::uniform_real_distribution<double> seconds(1e-4, 5e-3);
  std::uniform_real_distribution<double> log_bytes(std::log(1e3), std::log(1e8));
  std::vector<FluidLayer> layers(40);
  for (FluidLayer& l : layers) l = {seconds(random), seconds(random), std::exp(log_bytes(random))};
  double balanced = balanced_link_rate(layers);
  double previous = std::numeric_limits<double>::infinity();
  for (double factor = 0.05; factor < 20; factor *= 1.15) {
    CAPTURE(factor);
    FluidResult r = simulate_fluid(layers, balanced * factor, FluidPolicy::priority, 12);
    CHECK(r.iteration_s <= previous * (1 + kTolerance));
    // The lower bound: max(compute-only, every byte up once). Each term binds somewhere in the
    // sweep (bytes / rate below the balanced rate, compute above it).
    double bound = std::max(r.compute_s, total_bytes(layers) / (balanced * factor));
    CHECK(r.iteration_s >= bound * (1 - kTolerance));
    // And it is tight at both ends: within 1% at 1/20 of the balanced rate (1.0011 here); from
    // 4 times it on the iteration is compute-only plus the one wait no schedule avoids, the
    // first layer's gradient going up (and its value coming down with it) after the last
    // backward: every other value is back before its forward needs it.
    if (factor < 0.06) CHECK(r.iteration_s <= bound * 1.01);
    if (factor > 4)
      CHECK(r.iteration_s == near(r.compute_s + layers[0].bytes / (balanced * factor)));
    previous = r.iteration_s;
  }
}

TEST_CASE("priority is never slower than fifo") {
  // Seeded random profiles (the same every run): 1 to 30 layers, times and sizes spread over
  // orders of magnitude with some zeros, rates from 1/20 to 20 times the balanced rate. The
  // fluid limit of partitioned priority both orders by need and pipelines within a tensor, so
  // it should never lose to whole tensors first come first served.
  std::mt19937 random(20240612);
  std::uniform_real_distribution<double> unit(0, 1);
  auto spread = [&](double decades) {  // 0 one time in ten, else log-uniform over `decades`
    return unit(random) < 0.1 ? 0.0 : std::pow(10.0, decades * unit(random));
  };
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<FluidLayer> layers(1 + size_t(unit(random) * 30));
    for (FluidLayer& l : layers) l = {spread(3), spread(3), spread(5)};
    double rate = compute_only_s(layers) > 0 && total_bytes(layers) > 0
                      ? balanced_link_rate(layers) * std::pow(20.0, 2 * unit(random) - 1)
                      : 1;
    CAPTURE(trial);
    CAPTURE(rate);
    FluidResult priority = simulate_fluid(layers, rate, FluidPolicy::priority, 12);
    FluidResult fifo = simulate_fluid(layers, rate, FluidPolicy::fifo, 12);
    CHECK(priority.iteration_s <= fifo.iteration_s * (1 + kTolerance));
    CHECK(priority.iteration_s >=
          std::max(priority.compute_s, total_bytes(layers) / rate) * (1 - kTolerance));
  }
}

TEST_CASE("the balanced link rate sends every gradient in the compute-only time") {
  // compute 0.01 + 0.02 + 0.03 + 0.04 = 0.1 s; bytes 3e6 + 7e6 = 1e7 B -> 1e8 B/s.
  std::vector<FluidLayer> layers = {{0.01, 0.02, 3e6}, {0.03, 0.04, 7e6}};
  CHECK(balanced_link_rate(layers) == near(1e8));
  CHECK(total_bytes(layers) / balanced_link_rate(layers) == near(compute_only_s(layers)));
}

TEST_CASE("broken inputs are refused with the values involved") {
  std::vector<FluidLayer> one = {{1, 1, 1}};
  CHECK_THROWS_AS(simulate_fluid({}, 1, FluidPolicy::priority), std::logic_error);
  CHECK_THROWS_AS(simulate_fluid(one, 0, FluidPolicy::priority), std::logic_error);
  CHECK_THROWS_AS(simulate_fluid(one, 1, FluidPolicy::priority, 2), std::logic_error);
  CHECK_THROWS_AS(simulate_fluid({{1, -1, 1}}, 1, FluidPolicy::fifo), std::logic_error);
  CHECK_THROWS_AS(balanced_link_rate({{0, 0, 1}}), std::logic_error);
}

}  // namespace
}  // namespace psched::bench
