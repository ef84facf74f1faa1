// SPDX-License-Identifier: Apache-2.0
#include "bench/thread_cpu.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

namespace psched::bench {
namespace {

constexpr const char* kRoles[] = {"psched-client", "psched-shard", "psched-apply"};

bool is_role(const std::string& name) {
  return std::find(std::begin(kRoles), std::end(kRoles), name) != std::end(kRoles);
}

}  // namespace

std::map<std::string, double> thread_cpu_seconds() {
  std::map<std::string, double> seconds;
  for (const char* role : kRoles) seconds[role] = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    // schedstat's first field: nanoseconds this thread has run.
    std::ifstream comm(task.path() / "comm"), schedstat(task.path() / "schedstat");
    std::string name;
    uint64_t runtime_ns = 0;
    if (!std::getline(comm, name) || !(schedstat >> runtime_ns)) continue;  // it just exited
    if (is_role(name)) seconds[name] += double(runtime_ns) * 1e-9;
  }
  return seconds;
}

}  // namespace psched::bench
