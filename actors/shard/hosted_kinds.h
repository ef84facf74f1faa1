// SPDX-License-Identifier: Apache-2.0
// The one place that knows every kind of variable a shard hosts (actors/shard/hosted_kind.h):
// what registering each asks for, and how a checkpoint's record of each is read back. The shard
// (actors/shard/variable_shard.h) makes kinds only here and holds them as HostedKinds.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "actors/durability/shard_durability.h"
#include "actors/shard/hosted_kind.h"
#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "common/byte_codec.h"
#include "common/fork_join_pool.h"
#include "optim/device.h"

namespace psched {

// A registration, before anything is made of it: the shard compares it with what it hosts under
// the name (a second registration of the same spec is a no-op), checks it, logs it, and only
// then makes the kind.
class Enrollment {
 public:
  virtual ~Enrollment() = default;
  virtual const std::string& name() const = 0;
  // Throws Error(spec_conflict) naming what differs unless `hosted`, what the shard holds under
  // the name, is what this would make.
  virtual void check_same(const HostedKind& hosted) const = 0;
  // Throws Error naming what is wrong unless a kind can be made of it.
  virtual void check() const = 0;
  // Appends the registration to the shard's update log (ShardDurability::log_register*).
  virtual void log(ShardDurability& durability) const = 0;
  // The kind, once: the enrollment is spent after it.
  virtual std::unique_ptr<HostedKind> make() = 0;
};

// A dense variable's part `part` of `spec`, starting from `initial` (borrowed until make();
// part.size() elements), its updates on `apply_pool` or `device` (both optional, both outlive
// what is made; actors/shard/variable.h).
std::unique_ptr<Enrollment> enroll_variable(VariableSpec spec, ElementRange part,
                                            std::span<const std::byte> initial,
                                            ForkJoinPool* apply_pool, optim::ComputeDevice* device);
// An embedding table's rows on this shard (actors/shard/row_table.h).
std::unique_ptr<Enrollment> enroll_table(TableSpec spec);

// Throws Error(spec_conflict) naming the kind and what differs unless `next` is the same kind of
// the same spec and part as `served` (its values and state may differ): what a serving shard's
// newer version must be to take the place of `served` under the ids workers hold.
void check_same_kind(const HostedKind& served, const HostedKind& next);

// The kind whose checkpoint record starts in `in` (its KindTag, then what its save_head()
// wrote), a table's rows read from `rows`. Throws Error(corrupt_checkpoint) naming `in` when the
// record is malformed.
std::unique_ptr<HostedKind> restore_kind(ByteReader& in, ByteSource& rows, ForkJoinPool* apply_pool,
                                         optim::ComputeDevice* device);

}  // namespace psched
