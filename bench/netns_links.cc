// SPDX-License-Identifier: Apache-2.0
#include "bench/netns_links.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace psched::bench {
namespace {

constexpr const char* kNetnsDir = "/var/run/netns";  // where `ip netns add` mounts namespaces
constexpr const char* kPrefix = "psched-bench-";

// The full path of iproute2's `tool` ("ip", "tc"), or empty. Not via $PATH: root shells often
// lack /usr/sbin in it, and the names run as root.
std::string find_tool(const char* tool) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string path = std::string(dir) + tool;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

std::string tool_path(const char* tool) {
  std::string path = find_tool(tool);
  if (path.empty())
    throw std::runtime_error(fmt::format("`{}` not found (package iproute2)", tool));
  return path;
}

// Starts argv[0] (a full path) with argv, stdout and stderr going to `out_fd`. Returns its pid,
// or 0 with errno set.
pid_t spawn(std::vector<std::string>& argv, int out_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  errno = error;
  return error == 0 ? pid : 0;
}

// Reads `fd` to its end and closes it.
std::string read_all(int fd) {
  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) output.append(buffer, size_t(n));
  close(fd);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  return output;
}

// Runs argv (no shell: the arguments are passed as they are) and returns what it printed on
// stdout and stderr. Throws std::runtime_error naming the command unless it exits with 0.
std::string run_command(std::vector<std::string> argv) {
  argv[0] = tool_path(argv[0].c_str());
  std::string command = fmt::format("{}", fmt::join(argv, " "));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("`{}`: pipe: {}", command, std::strerror(errno)));
  pid_t pid = spawn(argv, fds[1]);
  int spawn_error = errno;
  close(fds[1]);
  std::string output = read_all(fds[0]);
  if (pid == 0)
    throw std::runtime_error(
        fmt::format("`{}` could not start: {}", command, std::strerror(spawn_error)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format(
        "`{}` failed ({} {}): {}", command, WIFEXITED(status) ? "exit status" : "signal",
        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), output));
  return output;
}

// Names of namespaces in kNetnsDir that a psched-bench process which has exited left behind.
std::vector<std::string> stale_namespaces() {
  std::vector<std::string> stale;
  DIR* dir = opendir(kNetnsDir);
  if (!dir) return stale;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    long pid = std::strtol(name.c_str() + std::strlen(kPrefix), nullptr, 10);
    if (pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(dir);
  return stale;
}

}  // namespace

// rate: the link's rate in bits per second. tbf counts whole frames (Ethernet, IP and TCP
// headers included), so with kMtu = 9000 the payload gets 99.3% of it; the in-process shaper
// counts payload only.
//
// burst: 2 ms of the rate (the in-process shaper's LinkShaper::kBurst), but at least 128 KiB.
// veth offloads segmentation (TSO/GSO), so TCP hands the qdisc super-packets of up to 64 KiB
// of payload; tbf must hold a whole one in its bucket or it splits it in software (and a
// bucket below one packet drops it). A 128 KiB bucket lets a link run ahead of its rate by
// 128 KiB after an idle spell: 26 ms at 40 Mbit/s, 1.3 ms at 800 Mbit/s, a small error
// against the megabytes an iteration moves.
//
// limit (the queue behind the bucket): tbf should only delay, never drop. A drop makes TCP
// halve its window and retransmit, so throughput would depend on TCP's recovery rather than
// on the rate. TCP Small Queues already caps each socket's bytes below TCP at
// net.ipv4.tcp_limit_output_bytes (4 MiB on our kernels, 1 MiB on older ones), so 256 MiB
// holds that for 64 connections per link, the most --shards allows; the queue only takes
// memory for what it holds. tbf_drops() lets callers check that it stayed at 0.
NetnsLinks::TbfParams NetnsLinks::tbf_params(double bytes_per_s) {
  auto rate_bits = uint64_t(std::llround(bytes_per_s * 8));
  auto burst = std::max<uint64_t>(uint64_t(bytes_per_s * 2e-3), 128 << 10);
  return {rate_bits, burst, uint64_t(256) << 20};
}

std::string NetnsLinks::unavailable_reason() {
  if (geteuid() != 0) return "not root (namespaces and tc need CAP_SYS_ADMIN and CAP_NET_ADMIN)";
  for (const char* tool : {"ip", "tc"})
    if (find_tool(tool).empty()) return fmt::format("`{}` not found (package iproute2)", tool);
  return {};
}

NetnsLinks::NetnsLinks(uint32_t workers, double bytes_per_s) {
  std::string base = fmt::format("{}{}-", kPrefix, getpid());
  shard_namespace_ = base + "s";
  for (uint32_t w = 0; w < workers; ++w)
    worker_namespaces_.push_back(fmt::format("{}w{}", base, w));
  for (const std::string& name : stale_namespaces()) {
    try {
      run_command({"ip", "netns", "delete", name});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "psched-bench: leaving stale namespace %s: %s\n", name.c_str(),
                   e.what());
    }
  }
  try {
    build(bytes_per_s);
  } catch (...) {
    remove_all();
    throw;
  }
}

NetnsLinks::~NetnsLinks() {
  remove_all();
}

std::string NetnsLinks::shard_side_address(uint32_t worker) {
  return fmt::format("10.77.{}.1", worker);
}
std::string NetnsLinks::worker_side_address(uint32_t worker) {
  return fmt::format("10.77.{}.2", worker);
}

void NetnsLinks::build(double bytes_per_s) {
  if (workers() > 250)
    throw std::runtime_error("NetnsLinks: at most 250 workers (10.77.<worker>.x)");
  auto add_namespace = [this](const std::string& name) {
    run_command({"ip", "netns", "add", name});
    created_.push_back(name);
    run_command({"ip", "-n", name, "link", "set", "lo", "up"});
  };
  TbfParams tbf = tbf_params(bytes_per_s);
  auto shape = [&tbf](const std::string& ns, const std::string& dev) {
    run_command({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 fmt::format("{}bit", tbf.rate_bits_per_s), "burst",
                 std::to_string(tbf.burst_bytes), "limit", std::to_string(tbf.limit_bytes)});
  };
  auto configure = [](const std::string& ns, const std::string& dev, const std::string& address) {
    run_command({"ip", "-n", ns, "addr", "add", address + "/24", "dev", dev});
    run_command({"ip", "-n", ns, "link", "set", dev, "up"});
  };
  const std::string& s = shard_namespace_;
  add_namespace(s);
  std::string mtu = std::to_string(kMtu);
  for (uint32_t w = 0; w < workers(); ++w) {
    const std::string& ns = worker_namespaces_[w];
    std::string shard_dev = fmt::format("s{}", w);
    add_namespace(ns);
    run_command({"ip", "-n", s, "link", "add", shard_dev, "mtu", mtu, "type", "veth", "peer",
                 "name", "eth0", "netns", ns, "mtu", mtu});
    configure(s, shard_dev, shard_side_address(w));
    configure(ns, "eth0", worker_side_address(w));
    shape(s, shard_dev);  // downlink: shard side egress
    shape(ns, "eth0");    // uplink: worker side egress
  }
}

void NetnsLinks::remove_all() noexcept {
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    try {
      run_command({"ip", "netns", "delete", *it});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "psched-bench: %s\n", e.what());
    }
  }
  created_.clear();
}

uint64_t NetnsLinks::tbf_drops(uint32_t worker) const {
  uint64_t drops = 0;
  auto add = [&drops](const std::string& ns, const std::string& dev) {
    auto qdiscs = nlohmann::json::parse(
        run_command({"tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev}));
    for (const auto& q : qdiscs)
      if (q.value("kind", "") == "tbf") drops += q.value("drops", uint64_t(0));
  };
  add(shard_namespace_, fmt::format("s{}", worker));
  add(worker_namespaces_.at(worker), "eth0");
  return drops;
}

void NetnsLinks::enter(const std::string& name) {
  std::string path = fmt::format("{}/{}", kNetnsDir, name);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  int rc = setns(fd, CLONE_NEWNET);
  int error = errno;
  close(fd);
  if (rc != 0)
    throw std::runtime_error(
        fmt::format("setns to network namespace {}: {}", name, std::strerror(error)));
}

}  // namespace psched::bench
