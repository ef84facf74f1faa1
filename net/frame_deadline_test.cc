// SPDX-License-Identifier: Apache-2.0
#include "net/frame_deadline.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "net/psched.capnp.h"

using namespace psched;

namespace {

// Two real frames back to back: one of several segments, one of a single segment.
kj::Array<kj::byte> two_frames() {
  capnp::MallocMessageBuilder many(2);  // tiny first segment: the name spills into more
  auto spec = many.initRoot<wire::VariableSpec>();
  spec.setName(std::string(100, 'n'));
  spec.initShape(20);
  capnp::MallocMessageBuilder one;
  one.initRoot<wire::ClusterLayout>().setWorkers(7);
  auto a = capnp::messageToFlatArray(many), b = capnp::messageToFlatArray(one);
  REQUIRE(many.getSegmentsForOutput().size() > 1);
  auto out = kj::heapArray<kj::byte>(a.asBytes().size() + b.asBytes().size());
  memcpy(out.begin(), a.asBytes().begin(), a.asBytes().size());
  memcpy(out.begin() + a.asBytes().size(), b.asBytes().begin(), b.asBytes().size());
  return out;
}

}  // namespace

TEST_CASE("the frame tracker finds frame ends however the bytes are split") {
  kj::Array<kj::byte> bytes = two_frames();
  // Fed byte by byte, the tracker is between frames only before each frame and at the end.
  std::vector<size_t> between;
  FrameTracker whole;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!whole.mid_frame()) between.push_back(i);
    whole.consume(&bytes[i], 1);
  }
  CHECK_FALSE(whole.mid_frame());
  REQUIRE(between.size() == 2);
  CHECK(between[0] == 0);
  size_t first_end = between[1];
  for (size_t split = 0; split <= bytes.size(); ++split) {
    FrameTracker t;
    t.consume(bytes.begin(), split);
    CHECK(t.mid_frame() == (split != 0 && split != first_end && split != bytes.size()));
    t.consume(bytes.begin() + split, bytes.size() - split);
    CHECK_FALSE(t.mid_frame());
  }
}

TEST_CASE("the frame tracker stops following a frame of more segments than Cap'n Proto reads") {
  FrameTracker t;
  kj::byte header[8] = {0xff, 0xff, 0, 0, 1, 0, 0, 0};
  t.consume(header, 8);
  CHECK_FALSE(t.mid_frame());
}
