// SPDX-License-Identifier: Apache-2.0
// Leases on their own: when a worker stops being a member, with chosen times.
#include "actors/shard/leases.h"

#include <chrono>
#include <vector>

#include <doctest/doctest.h>

using namespace psched;

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

TEST_CASE("a lease ends lease_seconds after the worker's last connection closed") {
  Leases leases(3, 3.0);
  Clock::time_point t0{};
  leases.connected(WorkerId(0));
  leases.connected(WorkerId(0));  // RPC connection and data stream, say
  leases.disconnected(WorkerId(0), t0);
  CHECK(leases.ended(t0 + std::chrono::seconds(10)).empty());  // one still open
  leases.disconnected(WorkerId(0), t0 + std::chrono::seconds(1));
  CHECK(leases.ended(t0 + std::chrono::milliseconds(3900)).empty());
  CHECK(leases.ended(t0 + std::chrono::seconds(4)) == std::vector<WorkerId>{WorkerId(0)});
  CHECK(leases.ended(t0 + std::chrono::seconds(9)).empty());  // reported once
  // A worker that reconnects within the lease keeps it.
  leases.connected(WorkerId(1));
  leases.disconnected(WorkerId(1), t0);
  leases.connected(WorkerId(1));
  CHECK(leases.ended(t0 + std::chrono::seconds(9)).empty());
  // Worker 2 never connected: it holds its lease until a resumed job starts the lease of every
  // worker without a connection (0's again, 2's).
  leases.start_all(t0 + std::chrono::seconds(10));
  CHECK(leases.ended(t0 + std::chrono::seconds(13)) ==
        std::vector<WorkerId>{WorkerId(0), WorkerId(2)});
}

TEST_CASE("leases never end when lease_seconds is 0") {
  Leases leases(1, 0);
  leases.connected(WorkerId(0));
  leases.disconnected(WorkerId(0), Clock::time_point{});
  CHECK(leases.ended(Clock::time_point{} + std::chrono::hours(24)).empty());
}

TEST_CASE("a disconnect without a connection and a worker's first connection change nothing") {
  Leases leases(2, 1.0);
  Clock::time_point t0{};
  leases.disconnected(WorkerId(1), t0);  // never connected: no lease starts running
  CHECK(leases.connections(WorkerId(1)) == 0);
  CHECK(leases.ended(t0 + std::chrono::hours(1)).empty());
  leases.connected(WorkerId(1));
  CHECK(leases.connections(WorkerId(1)) == 1);
  CHECK(leases.ended(t0 + std::chrono::hours(1)).empty());
}

TEST_CASE("a resumed job starts no lease of a worker that is connected") {
  Leases leases(2, 2.0);
  Clock::time_point t0{};
  leases.connected(WorkerId(0));
  leases.start_all(t0);
  CHECK(leases.ended(t0 + std::chrono::seconds(2)) == std::vector<WorkerId>{WorkerId(1)});
  leases.disconnected(WorkerId(0), t0 + std::chrono::seconds(5));
  CHECK(leases.ended(t0 + std::chrono::milliseconds(6999)).empty());
  CHECK(leases.ended(t0 + std::chrono::seconds(7)) == std::vector<WorkerId>{WorkerId(0)});
}
