// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/value_deltas.h"

#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include "compression/codec.h"

namespace psched {
namespace {

// A shard's values V of one range and the workers' copies that follow them by deltas.
struct Fixture {
  ValueDeltas deltas;
  ElementRange range{10, 18};
  std::vector<float> values = std::vector<float>(8, 0.f);
  std::vector<std::byte> body;

  // An update of the range applied: element i moves by by[i].
  void update(const std::vector<float>& by) {
    for (size_t i = 0; i < values.size(); ++i) values[i] += by[i];
    deltas.changed(range);
  }
  // A worker holding `copy` at `version` polls, sending at most `count` and keeping `ring`
  // (a refresh: `refresh`); applies the answer. Returns whether it was a delta.
  bool poll(std::vector<float>& copy, uint64_t& version, uint32_t count = 2, uint32_t ring = 2,
            bool refresh = false) {
    DeltaReply reply = deltas.answer(DType::float32, range, std::as_bytes(std::span(values)),
                                     {version, count, static_cast<uint16_t>(ring), refresh}, body);
    if (reply.delta) {
      apply_delta(DType::float32, body, std::as_writable_bytes(std::span(copy)));
    } else {
      REQUIRE(reply.full.size() == copy.size() * sizeof(float));
      std::memcpy(copy.data(), reply.full.data(), reply.full.size());
    }
    version = reply.version;
    return reply.delta;
  }
  // Two workers start: each one's first poll, full values.
  void start(std::vector<float>& a, uint64_t& va, std::vector<float>& b, uint64_t& vb) {
    CHECK_FALSE(poll(a, va));
    CHECK_FALSE(poll(b, vb));
  }
};

TEST_CASE("workers that poll the same version get the same delta, and what is left follows") {
  Fixture f;
  std::vector<float> a(8), b(8);
  uint64_t va = 0, vb = 0;
  CHECK_FALSE(f.poll(a, va));  // no version yet: full values
  CHECK_FALSE(f.poll(b, vb));
  CHECK(va == vb);
  f.update({1, 0, 0, 3, 0, 0.5, 0, 2});
  CHECK(f.poll(a, va));
  const std::vector<std::byte> first = f.body;
  CHECK(f.poll(b, vb));
  CHECK(f.body == first);  // the same delta, not a second one
  CHECK(f.deltas.published() == 1);
  CHECK(a == std::vector<float>{0, 0, 0, 3, 0, 0, 0, 2});
  CHECK(b == a);
  // Nothing changed: an empty delta, the same version.
  uint64_t before = va;
  CHECK(f.poll(a, va));
  CHECK(va == before);
  CHECK(f.body.size() == 8);
  // What the first delta left (1 and 0.5) goes next, with the next change.
  f.update({0, 0, 0, 0, 0, 0, 0.25, 0});
  CHECK(f.poll(a, va, 3));
  CHECK(a == f.values);
}

TEST_CASE("a worker a few versions behind gets the union; further behind, full values") {
  Fixture f;
  std::vector<float> fast(8), slow(8);
  uint64_t vf = 0, vs = 0;
  f.start(fast, vf, slow, vs);
  f.update({1, 2, 0, 0, 0, 0, 0, 0});
  f.poll(fast, vf);
  f.update({0, 0, 3, 4, 0, 0, 0, 0});
  f.poll(fast, vf);
  CHECK(f.poll(slow, vs));  // two behind, a ring of two: the union of both
  CHECK(slow == fast);
  CHECK(vs == vf);
  for (int i = 0; i < 3; ++i) {
    f.update({0, 0, 0, 0, float(i + 1), 0, 0, 0});
    f.poll(fast, vf);
  }
  CHECK_FALSE(f.poll(slow, vs));  // three behind: P whole, the copy every follower holds
  CHECK(slow == fast);
  CHECK(vs == vf);
  // A version that was never this shard's (an earlier incarnation's, a made-up one) gets full
  // values too.
  uint64_t stranger = 12345;
  std::vector<float> copy(8, 7.f);
  CHECK_FALSE(f.poll(copy, stranger));
  CHECK(copy == fast);
}

TEST_CASE("a worker as far behind as the ring, when a new delta pushes its oldest out: full") {
  Fixture f;
  std::vector<float> fast(8), slow(8);
  uint64_t vf = 0, vs = 0;
  f.start(fast, vf, slow, vs);
  for (int i = 0; i < 2; ++i) {
    f.update({1, 0, 0, 0, 0, 0, 0, float(i + 1)});
    f.poll(fast, vf);
  }
  f.update({0, 5, 0, 0, 0, 0, 0, 0});  // the slow worker's poll publishes the third
  CHECK_FALSE(f.poll(slow, vs));
  CHECK(vs == vf + 1);
  CHECK(f.poll(fast, vf));
  CHECK(fast == slow);
}

TEST_CASE("a refresh publishes the values whole: what was owed goes to every worker") {
  Fixture f;
  std::vector<float> a(8), b(8), late(8);
  uint64_t va = 0, vb = 0, vl = 0;
  f.poll(a, va);
  f.poll(b, vb);
  f.poll(late, vl);
  f.update({1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(f.poll(a, va, 1));  // the 8: the rest is owed
  CHECK(f.poll(b, vb, 1));
  f.update({1, 1, 1, 1, 1, 1, 1, 1});
  CHECK_FALSE(f.poll(a, va, 1, 2, true));  // publishes V whole
  CHECK(a == f.values);
  const uint64_t refreshed = va;
  CHECK_FALSE(f.poll(b, vb, 1, 2, true));  // the same step's refresh: the same version
  CHECK(vb == refreshed);
  CHECK(b == f.values);
  CHECK_FALSE(f.poll(late, vl));  // behind a whole version: whole
  CHECK(late == f.values);
  // Nothing is owed now: the next change goes out as it is.
  f.update({0, 0, 0, 0, 0, 0, 0, -1});
  CHECK(f.poll(a, va, 1));
  CHECK(a == f.values);
}

TEST_CASE("a poll for full values does not publish, and a range cut anew starts over") {
  Fixture f;
  std::vector<float> a(8);
  uint64_t va = 0;
  f.poll(a, va);
  f.update({1, 1, 1, 1, 1, 1, 1, 1});
  uint64_t v = va;
  CHECK_FALSE(f.poll(a, v, 0));  // count 0: full values, version unchanged
  CHECK(v == va);
  CHECK(f.deltas.published() == 0);
  CHECK(f.deltas.bytes() == 8 * sizeof(float));
  // Another cut of the same elements: the old copy is dropped, the new starts from V.
  f.range = {10, 14};
  std::vector<float> half(f.values.begin(), f.values.begin() + 4);
  std::vector<float> copy(4);
  uint64_t vc = 0;
  DeltaReply r =
      f.deltas.answer(DType::float32, f.range, std::as_bytes(std::span(half)), {vc, 2, 2}, f.body);
  CHECK_FALSE(r.delta);
  CHECK(f.deltas.bytes() == 4 * sizeof(float));
}

}  // namespace
}  // namespace psched
