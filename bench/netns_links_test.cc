// SPDX-License-Identifier: Apache-2.0
// NetnsLinks against the real kernel: runs only as root where network namespaces can be made;
// elsewhere it says why and exits with kSkipped, which ctest reports as skipped.
#include "bench/netns_links.h"

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <vector>

namespace psched::bench {
namespace {

constexpr int kSkipped = 77;   // SKIP_RETURN_CODE in bench/CMakeLists.txt
constexpr double kRate = 5e6;  // bytes/s: 40 Mbit/s
constexpr size_t kBytes = 3 << 20;

// A TCP listener on 0.0.0.0, any port, in the calling thread's namespace; returns fd and port.
std::pair<int, uint16_t> listen_any() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  socklen_t length = sizeof address;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(fd, 1) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw std::runtime_error("listener setup failed");
  return {fd, ntohs(address.sin_port)};
}

// Payload bytes per second from a socket made in namespace `from` to a listener in namespace
// `to` at `to_address`, measured by the receiver from its first byte to the end of stream.
double measured_rate(const std::string& from, const std::string& to,
                     const std::string& to_address) {
  auto [listener, port] = NetnsLinks::run_in(to, listen_any);
  // A socket belongs to the namespace it was created in, whichever thread uses it later.
  int sender =
      NetnsLinks::run_in(from, [] { return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); });
  auto received = std::async(std::launch::async, [listener = listener] {
    int fd = accept(listener, nullptr, nullptr);
    std::vector<char> buffer(1 << 16);
    size_t total = 0;
    auto first = std::chrono::steady_clock::now();
    for (ssize_t n; (n = read(fd, buffer.data(), buffer.size())) > 0; total += size_t(n))
      if (total == 0) first = std::chrono::steady_clock::now();
    close(fd);
    return double(total) /
           std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
  });
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  inet_pton(AF_INET, to_address.c_str(), &address.sin_addr);
  REQUIRE(connect(sender, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  std::vector<char> data(kBytes, 'x');
  for (size_t sent = 0; sent < data.size();) {
    ssize_t n = write(sender, data.data() + sent, data.size() - sent);
    REQUIRE(n > 0);
    sent += size_t(n);
  }
  close(sender);
  double rate = received.get();
  close(listener);
  return rate;
}

bool namespace_exists(const std::string& name) {
  struct stat s {};
  return stat(("/var/run/netns/" + name).c_str(), &s) == 0;
}

TEST_CASE("each worker's link is shaped to its rate in both directions, and goes with the object") {
  std::vector<std::string> names;
  {
    NetnsLinks links(2, kRate);
    names = {links.shard_namespace(), links.worker_namespace(0), links.worker_namespace(1)};
    for (const auto& name : names) CHECK(namespace_exists(name));
    // A correctness check that shaping is on, not a performance threshold: unshaped, veth
    // moves gigabytes per second.
    double up = measured_rate(links.worker_namespace(0), links.shard_namespace(),
                              NetnsLinks::shard_side_address(0));
    double down = measured_rate(links.shard_namespace(), links.worker_namespace(1),
                                NetnsLinks::worker_side_address(1));
    std::printf(
        "link rate %.1f Mbit/s: worker 0 uplink %.1f Mbit/s, worker 1 downlink %.1f Mbit/s\n",
        kRate * 8e-6, up * 8e-6, down * 8e-6);
    CHECK(up < 1.5 * kRate);
    CHECK(down < 1.5 * kRate);
    CHECK(links.tbf_drops(0) == 0);
    CHECK(links.tbf_drops(1) == 0);
  }
  for (const auto& name : names) CHECK_FALSE(namespace_exists(name));
}

TEST_CASE("the tbf bucket holds a 64 KiB GSO packet at any rate and 2 ms of a fast one") {
  CHECK(NetnsLinks::tbf_params(5e6).burst_bytes == 128 << 10);
  CHECK(NetnsLinks::tbf_params(1e9).burst_bytes == 2'000'000);
  CHECK(NetnsLinks::tbf_params(5e6).rate_bits_per_s == 40'000'000);
}

}  // namespace
}  // namespace psched::bench

int main(int argc, char** argv) {
  std::string why = psched::bench::NetnsLinks::unavailable_reason();
  if (why.empty()) {
    try {
      psched::bench::NetnsLinks probe(1, 1e6);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  if (!why.empty()) {
    std::printf("netns_links_test skipped: %s\n", why.c_str());
    return psched::bench::kSkipped;
  }
  return doctest::Context(argc, argv).run();
}
