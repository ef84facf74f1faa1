// SPDX-License-Identifier: Apache-2.0
// psched-example-trainer: trains logistic regression on a generated data set against a psched
// deployment, printing the loss per step. Run one per worker (--worker 0, 1, ..., or RANK and
// WORLD_SIZE in the environment as torchrun and deploy/slurm/psched.sbatch set them).
#include <cstdio>
#include <optional>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "apps/environment_index.h"
#include "apps/logistic_model.h"
#include "client/client.h"
#include "client/worker_monitor.h"
#include "common/error.h"
#include "config/deployment.h"

namespace {

struct Options {
  std::string config;
  std::optional<uint32_t> worker;  // default: $RANK, else 0
  uint32_t steps = 100;
  uint32_t features = 64;
  uint32_t samples = 4096;
  uint32_t batch = 256;
  uint32_t print_every = 10;
  std::string http;   // serve the worker's /metrics and /status here while training
  bool hold = false;  // after training, keep serving until stdin closes
  std::string dump;   // write the trained parameters here, one exact hex float per line
};

void dump_parameters(const std::string& file, const std::vector<float>& w, float b) {
  std::FILE* out = std::fopen(file.c_str(), "w");
  if (!out) throw std::runtime_error("cannot write --dump file " + file);
  for (float x : w) std::fprintf(out, "%a\n", double(x));
  std::fprintf(out, "%a\n", double(b));
  std::fclose(out);
}

std::span<std::byte> bytes(std::vector<float>& v) {
  return std::as_writable_bytes(std::span(v));
}

// This worker's id: --worker, else $RANK, else 0. $WORLD_SIZE, when set, must be the
// deployment's `workers` (as the Python module checks).
uint32_t worker_id(std::optional<uint32_t> flag, const psched::DeploymentConfig& config) {
  std::optional<uint32_t> world_size = psched::optional_environment_index("WORLD_SIZE");
  if (world_size && *world_size != config.workers)
    psched::fail(psched::ErrorCode::bad_config, "WORLD_SIZE={} but {} has workers: {}", *world_size,
                 config.source.string(), config.workers);
  return flag ? *flag : psched::optional_environment_index("RANK").value_or(0);
}

int train(const Options& o) {
  using namespace psched;
  DeploymentConfig config = load_deployment(o.config);
  uint32_t worker = worker_id(o.worker, config);
  example::Dataset data = example::make_dataset(o.features, o.samples, 1, 100 + worker);
  Client client(ClientOptions::from_config(config, WorkerId(worker)));
  std::optional<HttpServer> http;
  if (!o.http.empty()) {
    http.emplace(parse_listen_address(o.http), worker_routes(client));
    std::printf("worker %u: metrics on http://%s/metrics\n", worker, o.http.c_str());
  }

  std::vector<float> w(o.features, 0.f), b(1, 0.f);
  // Input layer first: lower priority value goes first.
  auto hw = client.register_variable(
      {.name = "logistic/w", .shape = {o.features}, .priority = Priority(0), .optimizer = {}},
      bytes(w), true);
  auto hb = client.register_variable(
      {.name = "logistic/b", .shape = {1}, .priority = Priority(1), .optimizer = {}}, bytes(b),
      true);
  // A trainer that joins a job under way (a restarted one) starts at the job's step, from the
  // values of the step before; in a fresh job at step 1, from the first registration's values.
  const uint32_t first = static_cast<uint32_t>(client.start_step().value);
  client.pull(hw, Step(first - 1));
  client.pull(hb, Step(first - 1));
  if (first > 1) std::printf("worker %u joins the job at step %u\n", worker, first);

  double floor = example::evaluate(data, {data.true_weights.begin(), data.true_weights.end() - 1},
                                   data.true_weights.back(), 0, data.samples())
                     .loss;
  std::printf("worker %u: %u features, %u samples, loss of the true model %.4f\n", worker,
              o.features, o.samples, floor);
  for (uint32_t step = first; step <= o.steps; ++step) {
    size_t begin = (size_t(step - 1) * o.batch) % (o.samples - o.batch + 1);
    auto lg = example::evaluate(data, w, b[0], begin, begin + o.batch);
    std::vector<float> grad_b{lg.grad_b};
    client.push(hb, Step(step), std::as_bytes(std::span(grad_b)));
    client.push(hw, Step(step), std::as_bytes(std::span(lg.grad_w)));
    client.wait(hw, Step(step));
    client.wait(hb, Step(step));
    if (step % o.print_every == 0 || step == first || step == o.steps) {
      auto full = example::evaluate(data, w, b[0], 0, data.samples());
      std::printf("worker %u step %4u  loss %.4f  accuracy %.3f\n", worker, step, full.loss,
                  full.accuracy);
      std::fflush(stdout);
    }
  }
  if (!o.dump.empty()) dump_parameters(o.dump, w, b[0]);
  if (o.hold) {
    std::printf("worker %u: trained; serving until stdin closes\n", worker);
    std::fflush(stdout);
    while (std::getchar() != EOF) {
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file, so each line leaves in one write and the lines of
  // several trainers sharing a terminal or a log never run together.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"psched-example-trainer: logistic regression against psched shards"};
  Options o;
  app.add_option("--config", o.config, "deployment YAML file (default: $PSCHED_CONFIG)")
      ->envname("PSCHED_CONFIG")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--worker", o.worker, "this worker's id (0 .. workers-1; default: $RANK, else 0)");
  app.add_option("--steps", o.steps, "training steps");
  app.add_option("--features", o.features, "input features")->check(CLI::Range(1u, 1u << 24));
  app.add_option("--samples", o.samples, "samples in this worker's data")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--print-every", o.print_every, "print the loss every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--http", o.http, "serve this worker's /metrics and /status on host:port");
  app.add_flag("--hold", o.hold, "after training, keep serving until stdin closes");
  app.add_option("--dump", o.dump, "write the trained parameters to this file (hex floats)");
  CLI11_PARSE(app, argc, argv);
  if (o.batch > o.samples) {
    std::fprintf(stderr, "--batch %u exceeds --samples %u\n", o.batch, o.samples);
    return 2;
  }
  try {
    return train(o);
  } catch (const std::exception& e) {  // psched::Error names the problem; others are bugs
    std::fprintf(stderr, "psched-example-trainer: %s\n", e.what());
    return 1;
  }
}
