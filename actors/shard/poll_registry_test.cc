// SPDX-License-Identifier: Apache-2.0
// PollRegistry on its own: polls answered as the ranges they wait for are applied, withdrawn,
// and failed, each exactly once.
#include "actors/shard/poll_registry.h"

#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "actors/runtime/test_loop.h"

using namespace psched;

namespace {

// The answers one poll got: "ok", or the refusal's code.
struct Answers {
  std::vector<std::string> got;
  PollRegistry::Answer answer() {
    return [this](const Result<>& r) {
      got.push_back(r ? "ok" : std::string(to_string(r.error().code())));
    };
  }
};

IntervalSet of(ElementRange r) {
  IntervalSet set;
  set.add(r);
  return set;
}

const PollKey kKey{WorkerId(0), VariableId(1), Step(3)};

}  // namespace

TEST_CASE("a poll is answered once every range it waits for is applied, not before") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  Answers a;
  polls.wait(kKey, PollTicket(1), of({0, 10}), a.answer());
  CHECK(polls.waiting() == 1);
  polls.applied(kKey, {0, 4});
  polls.applied(PollKey{WorkerId(1), VariableId(1), Step(3)}, {4, 10});  // another owner's
  polls.applied(PollKey{WorkerId(0), VariableId(1), Step(4)}, {4, 10});  // another step's
  CHECK(a.got.empty());
  polls.applied(kKey, {4, 10});
  CHECK(a.got == std::vector<std::string>{"ok"});
  CHECK(polls.waiting() == 0);
  polls.applied(kKey, {0, 10});  // nobody waits any more
  CHECK(a.got.size() == 1);
}

TEST_CASE("a poll with nothing left to wait for is answered at once") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  Answers a;
  polls.wait(kKey, PollTicket(1), IntervalSet(), a.answer());
  CHECK(a.got == std::vector<std::string>{"ok"});
  CHECK(polls.waiting() == 0);
}

TEST_CASE("one apply answers every poll it completes, each once, and only those") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  Answers whole, left, right;
  polls.wait(kKey, PollTicket(1), of({0, 8}), whole.answer());
  polls.wait(kKey, PollTicket(2), of({0, 4}), left.answer());
  polls.wait(kKey, PollTicket(3), of({4, 8}), right.answer());
  polls.applied(kKey, {2, 6});
  CHECK(whole.got.empty());
  CHECK(left.got.empty());
  CHECK(right.got.empty());
  polls.applied(kKey, {0, 2});
  CHECK(left.got == std::vector<std::string>{"ok"});
  CHECK(whole.got.empty());
  polls.applied(kKey, {6, 8});
  CHECK(whole.got == std::vector<std::string>{"ok"});
  CHECK(right.got == std::vector<std::string>{"ok"});
  CHECK(polls.waiting() == 0);
}

TEST_CASE("a withdrawn poll is never answered; withdrawing twice or unknown tickets is harmless") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  Answers kept, withdrawn;
  polls.wait(kKey, PollTicket(1), of({0, 4}), kept.answer());
  polls.wait(kKey, PollTicket(2), of({0, 4}), withdrawn.answer());
  polls.withdraw(PollTicket(2));
  polls.withdraw(PollTicket(2));
  polls.withdraw(PollTicket(99));
  CHECK(polls.waiting() == 1);
  polls.applied(kKey, {0, 4});
  CHECK(kept.got == std::vector<std::string>{"ok"});
  CHECK(withdrawn.got.empty());
  polls.withdraw(PollTicket(1));  // answered already: nothing happens
  CHECK(polls.waiting() == 0);
}

TEST_CASE("failing a key fails its polls with the error and leaves the others waiting") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  const PollKey other{WorkerId(2), VariableId(1), Step(3)};
  Answers a, b, c;
  polls.wait(kKey, PollTicket(1), of({0, 4}), a.answer());
  polls.wait(kKey, PollTicket(2), of({4, 8}), b.answer());
  polls.wait(other, PollTicket(3), of({0, 4}), c.answer());
  CHECK(polls.fail(kKey, Error(ErrorCode::sync_timeout, "late")) == 2);
  CHECK(polls.fail(kKey, Error(ErrorCode::sync_timeout, "again")) == 0);
  CHECK(a.got == std::vector<std::string>{"sync_timeout"});
  CHECK(b.got == std::vector<std::string>{"sync_timeout"});
  CHECK(c.got.empty());
  CHECK(polls.waiting() == 1);
  polls.withdraw(PollTicket(1));  // failed already: its ticket is free
  polls.fail_all(Error(ErrorCode::disconnected, "stopping"));
  CHECK(c.got == std::vector<std::string>{"disconnected"});
  CHECK(polls.waiting() == 0);
  polls.applied(other, {0, 4});
  CHECK(c.got.size() == 1);
}

TEST_CASE("a ticket freed by an answer can be used again") {
  testing::TestLoop io;
  PollRegistry polls(io.actors);
  Answers first, second;
  polls.wait(kKey, PollTicket(5), of({0, 1}), first.answer());
  polls.applied(kKey, {0, 1});
  polls.wait(kKey, PollTicket(5), of({1, 2}), second.answer());
  CHECK(polls.waiting() == 1);
  polls.withdraw(PollTicket(5));
  polls.applied(kKey, {1, 2});
  CHECK(first.got == std::vector<std::string>{"ok"});
  CHECK(second.got.empty());
}
