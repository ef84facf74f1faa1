// SPDX-License-Identifier: Apache-2.0
// Leases: when a worker stops being a member of a sync or bounded job (`sync.lease_seconds`,
// actors/shard/membership.h). A worker holds its lease while it has a connection to the shard,
// and for lease_seconds after its last one closed; a worker killed with SIGKILL closes its
// connections at once, so its lease ends lease_seconds later. A worker that has not connected
// since the shard started holds its lease (a job waits for its declared workers to start),
// unless the shard resumed a job under way (start_all). A hung worker that keeps its
// connection holds its lease: sync.timeout_seconds is for that.
//
// A plain value type owned by a shard's StepMachine, on its loop; `now` is the caller's, so
// that tests choose it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/types.h"

namespace psched {

class Leases {
 public:
  using Clock = std::chrono::steady_clock;

  // `lease_seconds` 0: leases never end.
  Leases(uint32_t workers, double lease_seconds);

  void connected(WorkerId worker);
  void disconnected(WorkerId worker, Clock::time_point now);
  // The shard resumed a job under way: the lease of every worker without a connection runs
  // from `now`, as if its connection had closed then.
  void start_all(Clock::time_point now);
  // The workers whose lease ended by `now`, each once per ending (a reconnect starts a new
  // lease).
  std::vector<WorkerId> ended(Clock::time_point now);
  // How many connections `worker` has open.
  uint32_t connections(WorkerId worker) const { return leases_.at(worker.value).connections; }

 private:
  struct Lease {
    uint32_t connections = 0;
    std::optional<Clock::time_point> closed;  // when the last connection closed, until it ends
  };
  std::vector<Lease> leases_;  // by worker id
  Clock::duration length_;
};

}  // namespace psched
