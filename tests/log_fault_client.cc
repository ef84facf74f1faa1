// SPDX-License-Identifier: Apache-2.0
// psched-log-fault-client: the worker of tests/log_fault_test.py. Pushes known gradients to
// one variable under plain SGD (lr 1, small integers, so every value is exact), and checks
// after a restart which steps the shard holds.
//
//   --steps N          push steps 1..N of worker 0, printing "acknowledged S" after each.
//                      A push refused with [io_error] is printed ("io_error at step S: ...")
//                      and sent again after a line arrives on stdin (EOF: exit 3).
//   --check N          register (adopting the shard's value), pull, and exit 0 when the value
//                      is exactly that after steps 1..N, else say which step it matches.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/client.h"
#include "common/error.h"
#include "config/deployment.h"

namespace {

constexpr uint64_t kElements = 8192;  // 32 KiB per push

float gradient(uint64_t step, uint64_t i) {
  // Not zero-sum over any run of steps, so the value tells exactly which steps were applied.
  return static_cast<float>(static_cast<int64_t>((step * 31 + i) % 7) - 2);
}

std::vector<float> expected(uint64_t steps) {
  std::vector<float> w(kElements, 0.f);
  for (uint64_t s = 1; s <= steps; ++s)
    for (uint64_t i = 0; i < kElements; ++i) w[i] -= gradient(s, i);
  return w;
}

psched::VariableHandle register_w(psched::Client& client, std::vector<float>& w) {
  psched::VariableSpec spec{
      .name = "w", .shape = {kElements}, .priority = psched::Priority(0), .optimizer = {}};
  spec.optimizer.kind = psched::optim::OptimizerKind::sgd;
  spec.optimizer.lr = 1;
  return client.register_variable(spec, std::as_writable_bytes(std::span(w)));
}

int push_steps(psched::Client& client, uint64_t steps) {
  std::vector<float> w(kElements, 0.f), g(kElements);
  auto handle = register_w(client, w);
  for (uint64_t s = 1; s <= steps;) {
    for (uint64_t i = 0; i < kElements; ++i) g[i] = gradient(s, i);
    try {
      client.push(handle, psched::Step(s), std::as_bytes(std::span(g)));
      client.wait(handle, psched::Step(s));
    } catch (const psched::Error& e) {
      if (e.code() != psched::ErrorCode::io_error) throw;
      std::printf("io_error at step %llu: %s\n", static_cast<unsigned long long>(s), e.what());
      std::fflush(stdout);
      std::string line;
      if (!std::getline(std::cin, line)) return 3;
      continue;  // the same step again
    }
    std::printf("acknowledged %llu\n", static_cast<unsigned long long>(s));
    std::fflush(stdout);
    ++s;
  }
  std::printf("done\n");
  return 0;
}

int check_steps(psched::Client& client, uint64_t steps) {
  std::vector<float> w(kElements, 0.f);
  auto handle = register_w(client, w);
  client.pull(handle);
  if (w == expected(steps)) {
    std::printf("the shard holds exactly steps 1..%llu\n", static_cast<unsigned long long>(steps));
    return 0;
  }
  for (uint64_t k = 0; k <= steps + 100; ++k)
    if (w == expected(k)) {
      std::printf("the shard holds steps 1..%llu, not 1..%llu\n",
                  static_cast<unsigned long long>(k), static_cast<unsigned long long>(steps));
      return 1;
    }
  std::printf("the shard holds no prefix of the steps\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-log-fault-client: known pushes, checked after a restart"};
  std::string config;
  uint64_t steps = 0, check = 0;
  app.add_option("--config", config)->required();
  auto* push_option = app.add_option("--steps", steps);
  auto* check_option = app.add_option("--check", check);
  push_option->excludes(check_option);
  CLI11_PARSE(app, argc, argv);
  try {
    psched::Client client(
        psched::ClientOptions::from_config(psched::load_deployment(config), psched::WorkerId(0)));
    return *check_option ? check_steps(client, check) : push_steps(client, steps);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
}
