// SPDX-License-Identifier: Apache-2.0
// ValueDeltas: a variable part's fresh values as deltas (`pull: topk`), the shard's half of
// error feedback on the way down (DoubleSqueeze, Tang et al. 2019; BytePS's server-side
// compression).
//
// For each range workers poll it keeps a published copy P of the values, which every worker
// that follows the deltas holds, and a version. When a poll finds the range changed since the
// last version, the shard publishes the next: the elements where the values V and P differ
// most (at most the poll's count), with their new values, copied into P (codec.h:
// encode_delta). What was not sent stays in V - P, the residual, and goes out once it is among
// the largest: each change arrives, late rather than never. Every worker polling the same
// version gets the same delta, so one copy serves them all (memory: one copy of the part).
//
// The last `ring` deltas' indices are kept: a worker a few versions behind gets their union,
// with P's values there. A worker with no version the shard can answer from (none yet, one
// from before the shard restarted, one further behind than the ring) gets P whole, and then
// follows the deltas from the current version, as every other worker does. Deltas write
// values rather than add differences, so applying one twice changes nothing and nothing
// accumulates on a worker.
//
// A refresh publishes V whole: P becomes V (the residual is sent, to everyone), the worker
// asking gets it, and so does every worker whose version is older (the ring marks it). In
// sync mode every worker asks at the same step, the first publishes, the rest get the same.
//
// Versions start at the shard's wall clock in ns when a range is first asked for and count
// up by one a delta, so a version from an earlier incarnation of the shard is never mistaken
// for one of this (publishing faster than one a nanosecond would be needed). Not kept across
// a restart: after one, every worker gets full values once.
//
// Part of a Variable (actors/shard/variable.h), on its shard's loop.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "common/dtype.h"
#include "common/placement.h"

namespace psched {

// What a worker's delta poll asks for.
struct DeltaAsk {
  uint64_t base = 0;     // the version the worker holds (0: none)
  uint32_t count = 0;    // the most elements a new delta sends (0: a poll for full values)
  uint32_t ring = 1;     // the deltas to keep for workers behind (at least 1)
  bool refresh = false;  // publish V whole (above)
};

// How a delta poll is answered.
struct DeltaReply {
  bool delta = false;    // a delta body; else the full values
  uint64_t version = 0;  // the worker holds it once the answer is applied
  // Full values: P, the published copy (valid until the next call; changed by later deltas:
  // copy it to send it).
  std::span<const std::byte> full{};
};

class ValueDeltas {
 public:
  // An update of `range` was applied: the next delta poll of a range it touches publishes.
  void changed(ElementRange range);

  // Answers `ask` for `range`, whose current values are `current` (its elements of `dtype`):
  // a delta body in `body` from the worker's version, publishing a new delta first when the
  // range changed; or, where the worker holds no version the shard can answer from or asks
  // for a refresh, full values (DeltaReply::full, to send whole). A range asked for the first
  // time, or one workers cut differently than before (a range that overlaps older ones, which
  // are forgotten), starts from `current`.
  DeltaReply answer(DType dtype, ElementRange range, std::span<const std::byte> current,
                    const DeltaAsk& ask, std::vector<std::byte>& body);

  // The bytes the published copies and rings hold.
  uint64_t bytes() const;
  // Deltas published so far.
  uint64_t published() const { return published_; }

 private:
  // A published version: a delta's indices, or V whole (a refresh).
  struct Version {
    bool whole = false;
    std::vector<uint32_t> indices;  // ascending
  };
  struct Published {
    ElementRange range;
    std::vector<std::byte> copy;  // P: what the deltas so far leave on a worker
    uint64_t first = 0;           // the version it started at
    uint64_t version = 0;         // the newest
    bool changed = false;         // V changed since `version`
    std::deque<Version> ring;     // the newest versions, the newest last
  };
  Published& find_or_start(ElementRange range, std::span<const std::byte> current, bool& started);
  // Publishes the next version of `p`: its delta into `body`, or V whole.
  void publish(DType dtype, Published& p, std::span<const std::byte> current, const DeltaAsk& ask,
               std::vector<std::byte>& body);
  void publish_whole(Published& p, std::span<const std::byte> current, const DeltaAsk& ask);
  // Keeps the newest `ring` versions of `p`, the one just published included.
  void keep(Published& p, Version version, const DeltaAsk& ask);
  // `p` whole, at its version.
  static DeltaReply whole(const Published& p) { return {false, p.version, p.copy}; }
  // Whether `p` can answer a worker holding `base` with a delta: a version of the ring's,
  // with no whole one after it.
  static bool answerable(const Published& p, uint64_t base);
  // The union of the deltas after `base` into `body`, with P's values.
  static void union_since(DType dtype, const Published& p, uint64_t base,
                          std::vector<std::byte>& body);

  std::vector<std::unique_ptr<Published>> ranges_;
  uint64_t published_ = 0;
};

}  // namespace psched
