// SPDX-License-Identifier: Apache-2.0
// StepTrack on its own: the pieces a push is cut into, when a step closes, what a poll waits
// for, who a step or a bounded poll waits for.
#include "actors/shard/step_track.h"

#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "common/error_test_support.h"

using namespace psched;
using psched::testing::code_of;

namespace {

std::vector<ElementRange> ranges_of(const StepUpdate& update, bool complete) {
  std::vector<ElementRange> out;
  for (const StepPiece& piece : update.pieces)
    if (piece.complete == complete) out.push_back(piece.range);
  return out;
}

}  // namespace

TEST_CASE("sync: a push is cut where others' pushes begin and end, each piece with its pushers") {
  StepTrack track("w", {0, 10}, Mode::sync, 3, nullptr);
  StepUpdate first = track.receive(WorkerId(0), Step(1), {0, 10});
  REQUIRE(first.pieces.size() == 1);
  CHECK(first.pieces[0].pushers == 0);  // the first pusher's gradient is copied, not applied
  CHECK_FALSE(first.pieces[0].complete);
  CHECK(first.gathered);
  CHECK(first.t == 1);
  track.receive(WorkerId(1), Step(1), {2, 6});
  StepUpdate last = track.receive(WorkerId(2), Step(1), {0, 8});
  // [0, 2) and [6, 8): workers 0 and 2 only; [2, 6): all three, complete.
  CHECK(ranges_of(last, true) == std::vector<ElementRange>{{2, 6}});
  CHECK(ranges_of(last, false) == std::vector<ElementRange>{{0, 2}, {6, 8}});
  CHECK(last.pieces[1].pushers == 2);
  CHECK_FALSE(last.closes);
  CHECK(track.missing_workers() == std::vector<uint32_t>{1, 2});
  CHECK(track.not_yet_applied(WorkerId(0), Step(1), {0, 10}).ranges() ==
        std::vector<ElementRange>{{0, 2}, {6, 10}});
  track.receive(WorkerId(1), Step(1), {0, 2});
  track.receive(WorkerId(1), Step(1), {6, 10});
  StepUpdate closing = track.receive(WorkerId(2), Step(1), {8, 10});
  CHECK(closing.closes);
  CHECK(track.applied_step(WorkerId(0)) == Step(1));
  CHECK_FALSE(track.step_in_progress());
}

TEST_CASE("async: each worker's step is numbered as it begins and closes when it covers the part") {
  StepTrack track("w", {0, 4}, Mode::async, 2, nullptr);
  StepUpdate a = track.receive(WorkerId(0), Step(1), {0, 2});
  StepUpdate b = track.receive(WorkerId(1), Step(1), {0, 4});
  StepUpdate c = track.receive(WorkerId(0), Step(1), {2, 4});
  CHECK(a.t == 1);
  CHECK(b.t == 2);
  CHECK(c.t == 1);  // worker 0's step 1 keeps its number
  CHECK_FALSE(a.closes);
  CHECK(b.closes);
  CHECK(c.closes);
  CHECK_FALSE(a.gathered);
  CHECK(ranges_of(a, true) == std::vector<ElementRange>{{0, 2}});
  CHECK(track.receive(WorkerId(0), Step(2), {0, 4}).t == 3);
  CHECK(track.latest_step() == Step(2));
  CHECK(track.applied_step(WorkerId(1)) == Step(1));
}

TEST_CASE("a resent partition is a duplicate; a partial overlap or a later step is refused") {
  for (Mode mode : {Mode::async, Mode::sync}) {
    CAPTURE(mode == Mode::sync);
    StepTrack track("w", {0, 4}, mode, 2, nullptr);
    CHECK_FALSE(track.is_duplicate(WorkerId(0), Step(1), {0, 2}));
    track.receive(WorkerId(0), Step(1), {0, 2});
    CHECK(track.is_duplicate(WorkerId(0), Step(1), {0, 2}));
    CHECK(code_of([&] {
            track.is_duplicate(WorkerId(0), Step(1), {1, 3});
          }) == ErrorCode::stale_step);
    CHECK(code_of([&] {
            track.is_duplicate(WorkerId(0), Step(2), {0, 2});
          }) == ErrorCode::step_from_future);
    CHECK(code_of([&] {
            track.not_yet_applied(WorkerId(0), Step(2), {0, 2});
          }) == ErrorCode::step_from_future);
  }
  StepTrack sync("w", {0, 4}, Mode::sync, 2, nullptr);
  CHECK(code_of([&] {
          sync.is_duplicate(WorkerId(2), Step(1), {0, 4});
        }) == ErrorCode::invalid_argument);
}

TEST_CASE("bounded: a poll waits for the members that joined by step - staleness") {
  Membership members(3, 1);
  StepTrack track("w", {0, 2}, Mode::bounded, 3, &members);
  for (uint32_t w = 0; w < 2; ++w) track.receive(WorkerId(w), Step(1), {0, 2});
  CHECK(track.behind(Step(1), 1).empty());  // step 0 is everyone's
  CHECK(track.behind(Step(2), 1) == std::vector<uint32_t>{2});
  CHECK(track.behind(Step(2), 2).empty());
  members.leave(WorkerId(2));
  CHECK(track.behind(Step(2), 1).empty());
  CHECK(code_of([&] {
          track.is_duplicate(WorkerId(2), Step(1), {0, 2});
        }) == ErrorCode::not_a_member);
  members.join(WorkerId(2), Step(5));
  track.skip_to(WorkerId(2), Step(4));  // it goes on from step 5
  CHECK(track.applied_step(WorkerId(2)) == Step(4));
  CHECK(track.behind(Step(5), 1) == std::vector<uint32_t>{0, 1});
}

TEST_CASE("a saved track loads into one that decides the same") {
  for (Mode mode : {Mode::async, Mode::sync}) {
    CAPTURE(mode == Mode::sync);
    StepTrack track("w", {0, 4}, mode, 2, nullptr);
    track.receive(WorkerId(0), Step(1), {0, 4});
    track.receive(WorkerId(1), Step(1), {0, 2});
    ByteWriter out;
    track.save(out);
    StepTrack loaded("w", {0, 4}, mode, 2, nullptr);
    ByteReader in(out.bytes(), "track");
    loaded.load(in);
    CHECK(in.done());
    for (StepTrack* t : {&track, &loaded}) {
      CHECK(t->is_duplicate(WorkerId(1), Step(1), {0, 2}));
      StepUpdate rest = t->receive(WorkerId(1), Step(1), {2, 4});
      CHECK(rest.closes);  // worker 1's step (async), the step (sync)
      CHECK(rest.t == (mode == Mode::sync ? 1 : 2));
    }
    CHECK(loaded.latest_step() == track.latest_step());
  }
}
