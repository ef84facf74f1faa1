// SPDX-License-Identifier: Apache-2.0
// psched-member-client: the worker of tests/membership_process_test.py. Pushes known
// gradients (small integers, so any sum is exact) to three variables under plain SGD (lr 1)
// from the step the shards give it (Client::start_step) to --steps, printing "step S" once a
// step's values are back, then writes the variables' final values to --dump. The test replays the
// recorded membership of every step against these gradients.
//
//   psched-member-client --config F --worker W --steps N --compute-ms M --dump FILE
//       [--slow-every K --slow-ms S]   (step s takes S ms instead of M when (s + W) % K == 0:
//                                       a straggler that moves from worker to worker)
// It prints the seconds its steps took ("steps took T s") for bench/membership_bench.sh.

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/client.h"
#include "common/error.h"
#include "config/deployment.h"

namespace {

// The variables' sizes; the test's config splits the largest over both shards.
constexpr uint64_t kElements[] = {40000, 12000, 900};

// Worker `worker`'s gradient of element `i` of variable `variable` at `step`: in [-4, 4].
float gradient(uint32_t worker, uint32_t variable, uint64_t step, uint64_t i) {
  return static_cast<float>(
             static_cast<int64_t>((worker * 7 + variable * 11 + step * 31 + i * 3) % 9)) -
         4;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("psched-member-client: a worker of tests/membership_process_test.py");
  std::string config_file, dump;
  uint32_t worker = 0;
  uint64_t steps = 100;
  uint32_t compute_ms = 0, slow_every = 0, slow_ms = 0;
  app.add_option("--config", config_file)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--steps", steps)->required();
  app.add_option("--compute-ms", compute_ms, "sleep this long per step, as if computing");
  app.add_option("--slow-every", slow_every, "every K-th step (offset by the worker id) is slow");
  app.add_option("--slow-ms", slow_ms, "how long a slow step computes");
  app.add_option("--dump", dump)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    auto config = psched::load_deployment(config_file);
    psched::Client client(psched::ClientOptions::from_config(config, psched::WorkerId(worker)));
    const uint64_t first = client.start_step().value;
    std::printf("start step %lu\n", static_cast<unsigned long>(first));
    std::fflush(stdout);
    std::vector<std::vector<float>> values, grads;
    std::vector<psched::VariableHandle> handles;
    for (uint32_t v = 0; v < std::size(kElements); ++v) {
      values.emplace_back(kElements[v], 0.f);
      grads.emplace_back(kElements[v]);
      psched::VariableSpec spec{.name = "v" + std::to_string(v), .shape = {kElements[v]}};
      spec.optimizer.kind = psched::optim::OptimizerKind::sgd;
      spec.optimizer.lr = 1;
      handles.push_back(
          client.register_variable(spec, std::as_writable_bytes(std::span(values[v]))));
      client.pull(handles[v], psched::Step(first - 1));
    }
    auto began = std::chrono::steady_clock::now();
    for (uint64_t s = first; s <= steps; ++s) {
      bool slow = slow_every != 0 && (s + worker) % slow_every == 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(slow ? slow_ms : compute_ms));
      for (uint32_t v = 0; v < handles.size(); ++v) {
        for (uint64_t i = 0; i < kElements[v]; ++i) grads[v][i] = gradient(worker, v, s, i);
        client.push(handles[v], psched::Step(s), std::as_bytes(std::span(grads[v])));
      }
      for (psched::VariableHandle h : handles) client.wait(h, psched::Step(s));
      std::printf("step %lu\n", static_cast<unsigned long>(s));
      std::fflush(stdout);
    }
    std::printf("steps took %.3f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    std::FILE* out = std::fopen(dump.c_str(), "wb");
    if (!out) throw std::runtime_error("cannot write --dump file " + dump);
    for (const auto& v : values) std::fwrite(v.data(), sizeof(float), v.size(), out);
    std::fclose(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "psched-member-client: %s\n", e.what());
    return 1;
  }
  return 0;
}
