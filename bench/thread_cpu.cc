// SPDX-License-Identifier: Apache-2.0
#include "bench/thread_cpu.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace psched::bench {
namespace {

// utime + stime (fields 14 and 15) of a /proc/<pid>/task/<tid>/stat line, in clock ticks.
// The name (field 2) is in parentheses and may hold spaces: fields are counted after it.
long ticks_of(const std::string& stat) {
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

std::string role_of(const std::string& name) {
  for (const char* role : {"psched-client", "psched-shard", "psched-apply"})
    if (name == role) return name;
  return "other";
}

}  // namespace

std::map<std::string, double> thread_cpu_seconds() {
  std::map<std::string, double> seconds;
  const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm"), stat(task.path() / "stat");
    std::string name, line;
    if (!std::getline(comm, name) || !std::getline(stat, line)) continue;  // it just exited
    seconds[role_of(name)] += double(ticks_of(line)) * tick;
  }
  return seconds;
}

}  // namespace psched::bench
