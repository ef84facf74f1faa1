// SPDX-License-Identifier: Apache-2.0
// NetnsLinks: a throwaway network topology for one benchmark run, shaped by the kernel. Needs
// root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip` and `tc`.
//
//   namespace psched-bench-<pid>-s        namespace psched-bench-<pid>-w<i>, one per worker
//   s<i>  10.77.<i>.1/24  <---- veth ---->  eth0  10.77.<i>.2/24
//   egress: tbf = worker i's downlink       egress: tbf = worker i's uplink
//
// Each worker has its own link of the given rate in each direction; the shards, all in the
// shard namespace, are reached by worker i at 10.77.<i>.1 and are not shaped otherwise. The
// destructor deletes the namespaces (which deletes their veth ends and qdiscs).
//
// Threads enter a namespace with setns(CLONE_NEWNET), which moves only the calling thread;
// threads it creates afterwards start in its namespace. So a server or client object that
// opens its sockets on threads it creates (ShardThreads, Client) lives in the namespace of the
// thread that constructed it: see run_in().
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace psched::bench {

class NetnsLinks {
 public:
  // The tbf parameters for a link of `bytes_per_s` (see netns_links.cc for why these values).
  struct TbfParams {
    uint64_t rate_bits_per_s;
    uint64_t burst_bytes;
    uint64_t limit_bytes;
  };
  static TbfParams tbf_params(double bytes_per_s);
  static constexpr int kMtu = 9000;  // jumbo frames: TCP/IP/Ethernet headers cost 0.7% of the rate

  // Why NetnsLinks cannot be made here (not root, no `ip` or `tc`), or empty if it may work.
  // Creating one can still fail (e.g. no namespace support); the constructor then says why.
  static std::string unavailable_reason();

  // Deletes namespaces left behind by dead psched-bench processes, then builds the topology
  // for `workers` workers with links of `bytes_per_s` each way. Throws std::runtime_error
  // naming the command that failed and what it printed; what was built so far is deleted.
  NetnsLinks(uint32_t workers, double bytes_per_s);
  ~NetnsLinks();
  NetnsLinks(const NetnsLinks&) = delete;
  NetnsLinks& operator=(const NetnsLinks&) = delete;

  uint32_t workers() const { return uint32_t(worker_namespaces_.size()); }
  const std::string& shard_namespace() const { return shard_namespace_; }
  const std::string& worker_namespace(uint32_t worker) const {
    return worker_namespaces_.at(worker);
  }
  // The shard namespace's end of `worker`'s link: where that worker connects to shards.
  static std::string shard_side_address(uint32_t worker);
  static std::string worker_side_address(uint32_t worker);
  // tbf's drop count on both ends of `worker`'s link so far (should stay 0: see the .cc).
  uint64_t tbf_drops(uint32_t worker) const;

  // Runs `fn` on a new thread that has joined network namespace `name` and returns its result
  // (or rethrows what it threw). Threads `fn` starts stay in that namespace for their life.
  template <typename Fn>
  static auto run_in(const std::string& name, Fn fn) -> std::invoke_result_t<Fn>;

 private:
  // Joins the calling thread to network namespace `name`; throws std::runtime_error.
  static void enter(const std::string& name);
  void build(double bytes_per_s);
  void remove_all() noexcept;

  std::string shard_namespace_;
  std::vector<std::string> worker_namespaces_;
  std::vector<std::string> created_;  // namespaces to delete, in creation order
};

template <typename Fn>
auto NetnsLinks::run_in(const std::string& name, Fn fn) -> std::invoke_result_t<Fn> {
  using Result = std::invoke_result_t<Fn>;
  std::exception_ptr error;
  if constexpr (std::is_void_v<Result>) {
    std::thread([&] {
      try {
        enter(name);
        fn();
      } catch (...) {
        error = std::current_exception();
      }
    }).join();
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<Result> result;
    std::thread([&] {
      try {
        enter(name);
        result.emplace(fn());
      } catch (...) {
        error = std::current_exception();
      }
    }).join();
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

}  // namespace psched::bench
