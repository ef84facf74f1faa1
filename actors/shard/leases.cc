// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/leases.h"

namespace psched {

Leases::Leases(uint32_t workers, double lease_seconds)
    : leases_(workers),
      length_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(lease_seconds))) {}

void Leases::connected(WorkerId worker) {
  Lease& lease = leases_.at(worker.value);
  ++lease.connections;
  lease.closed.reset();
}

void Leases::disconnected(WorkerId worker, Clock::time_point now) {
  Lease& lease = leases_.at(worker.value);
  if (lease.connections > 0 && --lease.connections == 0) lease.closed = now;
}

void Leases::start_all(Clock::time_point now) {
  for (Lease& lease : leases_)
    if (lease.connections == 0) lease.closed = now;
}

std::vector<WorkerId> Leases::ended(Clock::time_point now) {
  std::vector<WorkerId> out;
  if (length_ == Clock::duration::zero()) return out;
  for (uint32_t w = 0; w < leases_.size(); ++w) {
    Lease& lease = leases_[w];
    if (lease.closed && now - *lease.closed >= length_) {
      lease.closed.reset();
      out.push_back(WorkerId(w));
    }
  }
  return out;
}

}  // namespace psched
