// SPDX-License-Identifier: Apache-2.0
// HostedKind: what a shard asks of every kind of variable it hosts: a dense Variable's part
// (actors/shard/variable.h) or an embedding table's rows (actors/shard/row_table.h). The shard
// (actors/shard/variable_shard.h) routes a request to the kind its id names and replies; its
// StepMachine (actors/shard/step_machine.h) decides when updates apply and polls are answered,
// and runs a push's sequence (admit, log, receive, take, applied) for every kind alike. A kind
// keeps values and optimizer state and carries out what the machine decides:
//
//   check_push, check_poll   what is its own to check (dtype, range, ids, bytes), changing
//                            nothing; they name the units of its StepTrack a request covers
//   take, apply_gathered     the machine's StepUpdates: apply now, or gather a sync step's sums
//   read, view               a poll's answer
//   save_*, load_sums,       what a checkpoint keeps of it (the record layout:
//   freeze, save_chunk       actors/shard/variable_shard_state.cc)
//
// The shard never asks which kind it holds: only the factory that makes kinds
// (actors/shard/hosted_kinds.h) knows them by name. A third kind is one more class here.
//
// Owner and threads: the shard owns its kinds and calls them on its loop only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/shard/shard_request.h"
#include "actors/shard/shard_stats.h"
#include "actors/shard/step_track.h"
#include "common/byte_codec.h"
#include "common/dtype.h"
#include "common/shard_settings.h"
#include "common/types.h"

namespace psched {

class ValueDeltas;

// What a kind is, in a checkpoint: the tag its record starts with (the factory reads it).
enum class KindTag : uint8_t { variable = 0, table = 1 };

class HostedKind {
 public:
  virtual ~HostedKind() = default;

  virtual KindTag tag() const = 0;
  virtual const std::string& name() const = 0;
  // Lower is more urgent: the order a connection's answers leave in.
  virtual Priority priority() const = 0;
  virtual DType dtype() const = 0;
  // The units a step covers, what its StepTrack tracks: a variable's part of its elements; a
  // table's one unit [0, 1) (every worker's step of a table pushes all its rows here at once).
  virtual ElementRange extent() const = 0;
  // How its steps wait, from the shard's settings: a variable the job's mode, a table its own
  // rule (ShardSettings::table_rule: Persia's hybrid, dense sync beside bounded tables).
  virtual StepRule step_rule(const ShardSettings& settings) const = 0;

  // Throws Error naming what is wrong (and changes nothing) unless `push` fits the kind: its
  // dtype, its range or ids, its bytes. Returns the units it covers.
  virtual ElementRange check_push(const Push& push) const = 0;
  // The same for a poll or a pull (`what` names it: "poll", "pull"): the units whose update it
  // waits for.
  virtual ElementRange check_poll(const char* what, const Poll& poll) const = 0;
  // Carries out what the step machine decided for an accepted push (check_push passed): each
  // of `update`'s pieces applied now or gathered into the step's sums.
  virtual void take(const StepUpdate& update, const Push& push) = 0;
  // Applies the mean gathered for each of `update`'s complete pieces that any worker pushed (a
  // membership change or a timeout completed them); the rest stay as they are.
  virtual void apply_gathered(const StepUpdate& update) = 0;

  // Bytes of the answer to `poll` (check_poll passed), and the answer copied into `out`.
  virtual uint64_t answer_bytes(const Poll& poll) const = 0;
  virtual void read(const Poll& poll, std::span<std::byte> out) const = 0;
  // The answer where it lives, when the kind keeps it in one piece (a range of a dense
  // variable): changed in place by the next update, which only the shard's loop makes. Empty
  // when it does not: the answer is then read().
  virtual std::span<const std::byte> view(const Poll&) const { return {}; }
  // Its fresh values as deltas (`pull: topk`), for a kind that publishes them; else null.
  virtual ValueDeltas* deltas() { return nullptr; }

  // Limits on what the shard stores (limits.max_table_bytes): the bytes its rows hold now, and
  // about how many more taking `push` would store.
  virtual uint64_t stored_bytes() const { return 0; }
  virtual uint64_t growth_bytes(const Push&) const { return 0; }

  // Counts an accepted push and an answer (rows pushed and pulled, for the operator view).
  virtual void count_push(const Push&) {}
  virtual void count_answer(const Poll&) {}
  // Adds what it shows operators to `stats` (ShardStats: its count, a table's figures).
  virtual void report(ShardStats& stats) const = 0;
  // How it shows in the shard's list of variable parts (VariableShard::variables), its newest
  // complete step `step`; nullopt where it shows elsewhere (a table, in report()).
  virtual std::optional<VariableStatus> status(Step) const { return std::nullopt; }

  // A checkpoint's record of it, in three parts around its StepTrack's: save_head (what makes
  // it again: its spec, values and state), then the track, then save_sums (a sync step's
  // sums); load_sums reads those back. A kind's restore (the factory's) reads save_head.
  virtual void save_head(ByteWriter& out) const = 0;
  virtual void save_sums(ByteWriter& out) const = 0;
  virtual void load_sums(ByteReader& in) = 0;
  // A kind whose stored units stream after the checkpoint's payload (a table's rows;
  // ShardDurability::State::freeze_rows): freeze() keeps them as they are now, their bytes in
  // the stream from `base` on, and returns their bytes; save_chunk() emits the next frozen
  // chunk, false when none is left. Kinds saved whole by save_head stream nothing.
  using Emit = std::function<void(uint64_t offset, std::vector<std::byte> bytes)>;
  virtual uint64_t freeze(uint64_t /*base*/, Emit /*emit*/) { return 0; }
  virtual bool save_chunk() { return false; }
};

}  // namespace psched
