// SPDX-License-Identifier: Apache-2.0
// Which connections get into a shard, and how refusals are logged.
#include "server/connection_admission.h"

#include <doctest/doctest.h>

#include "common/error.h"

using namespace psched;

namespace {

struct Admitted {
  std::shared_ptr<ConnectionTicket> ticket;
  kj::Promise<void> closed = nullptr;
};

Admitted admit(ConnectionAdmission& admission, std::string peer) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  return {admission.open(std::move(peer), kj::mv(paf.fulfiller)), kj::mv(paf.promise)};
}

LimitsConfig limits(uint64_t sessions, uint64_t waiting) {
  LimitsConfig l;
  l.max_connections = sessions;
  l.max_unauthenticated_connections = waiting;
  return l;
}

}  // namespace

TEST_CASE("one connection over the waiting budget closes the oldest waiting one") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  LimitsConfig l = limits(4, 2);
  ConnectionAdmission admission(ShardId(0), "127.0.0.1:7000", l);
  Admitted a = admit(admission, "a"), b = admit(admission, "b");
  CHECK_FALSE(a.closed.poll(scope));
  Admitted c = admit(admission, "c");
  CHECK(a.closed.poll(scope));
  CHECK_FALSE(b.closed.poll(scope));
  CHECK(admission.waiting() == 2);
  admission.closed(*a.ticket);  // the listener's cleanup, after closing it
  CHECK(admission.waiting() == 2);
}

TEST_CASE("an authenticated connection leaves the waiting budget and is never closed for it") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  LimitsConfig l = limits(4, 1);
  ConnectionAdmission admission(ShardId(0), "127.0.0.1:7000", l);
  Admitted worker = admit(admission, "worker");
  admission.authenticate(*worker.ticket);
  Admitted idle = admit(admission, "idle"), next = admit(admission, "next");
  CHECK_FALSE(worker.closed.poll(scope));
  CHECK(idle.closed.poll(scope));
  CHECK(admission.authenticated() == 1);
  admission.closed(*worker.ticket);
  CHECK(admission.authenticated() == 0);
}

TEST_CASE("a connect past max_connections is refused as overloaded, naming the shard and limit") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  LimitsConfig l = limits(1, 4);
  ConnectionAdmission admission(ShardId(0), "127.0.0.1:7000", l);
  Admitted first = admit(admission, "first"), second = admit(admission, "second");
  admission.authenticate(*first.ticket);
  admission.authenticate(*first.ticket);  // twice counts once
  try {
    admission.authenticate(*second.ticket);
    FAIL("expected a refusal");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::overloaded);
    CHECK(std::string(e.what()).starts_with("shard 127.0.0.1:7000 is at max_connections (1"));
  }
  admission.closed(*first.ticket);
  admission.authenticate(*second.ticket);  // a slot is free again
  CHECK(admission.authenticated() == 1);
}

TEST_CASE("refusals are logged up to a burst per window and kind, then counted") {
  RefusalLog log(ShardId(0), 3, std::chrono::seconds(10));
  auto t0 = RefusalLog::Clock::time_point() + std::chrono::hours(1);
  int logged = 0;
  for (int i = 0; i < 100; ++i) logged += log.refused("connect", "peer", "wrong token", t0);
  CHECK(logged == 3);
  CHECK(log.left_out("connect") == 97);
  CHECK(log.refused("auth_timeout_seconds", "peer", "no connect", t0));  // another kind
  CHECK_FALSE(log.refused("connect", "peer", "wrong token", t0 + std::chrono::seconds(9)));
  CHECK(log.refused("connect", "peer", "wrong token", t0 + std::chrono::seconds(11)));
  CHECK(log.left_out("connect") == 0);
}

TEST_CASE("data streams count apart from sessions, up to max_connections of them") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  LimitsConfig l = limits(1, 4);
  ConnectionAdmission admission(ShardId(0), "127.0.0.1:7000", l);
  Admitted session = admit(admission, "worker"), data = admit(admission, "worker data");
  admission.authenticate(*session.ticket);
  admission.join_session(*data.ticket);  // the session's stream: not refused at 1 session
  CHECK(admission.authenticated() == 1);
  CHECK(admission.waiting() == 0);
  Admitted second = admit(admission, "second data");
  try {
    admission.join_session(*second.ticket);
    FAIL("a second data stream was admitted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::overloaded);
    CHECK(std::string(e.what()).find("data streams open") != std::string::npos);
  }
  admission.closed(*data.ticket);
  CHECK(admission.authenticated() == 1);  // the session still counts
  admission.join_session(*second.ticket);
  admission.closed(*session.ticket);
  CHECK(admission.authenticated() == 0);
}
