// SPDX-License-Identifier: Apache-2.0
#include "bench/loopback_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <vector>

namespace psched::bench {
namespace {

// A socket bound to 127.0.0.1:`port` (0: the kernel's choice), or -1 where that port is taken.
int bound(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

uint16_t port_of(int fd) {
  sockaddr_in address{};
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  return ntohs(address.sin_port);
}

}  // namespace

uint16_t free_loopback_ports(unsigned count) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<int> held{bound(0)};
    if (held[0] < 0) break;
    const uint16_t first = port_of(held[0]);
    while (held.back() >= 0 && held.size() < count && first + held.size() <= 65535)
      held.push_back(bound(static_cast<uint16_t>(first + held.size())));
    const bool all = held.back() >= 0 && held.size() == count;
    for (int fd : held)
      if (fd >= 0) ::close(fd);
    if (all) return first;
  }
  throw std::runtime_error("no free run of loopback ports found");
}

}  // namespace psched::bench
