// SPDX-License-Identifier: Apache-2.0
// VariableShard's side of its durability (ShardDurability::State): what a checkpoint holds of
// the shard's kinds, and the update log's records made again.
#include "actors/durability/shard_store.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"

namespace psched {

// A checkpoint's payload after the step machine's record: the count of hosted ids, then each in
// id order: its KindTag, its head (HostedKind::save_head), its track, its sums. A kind's units
// that stream (a table's rows) follow the payload (freeze_rows).
void VariableShard::save_variables(ByteWriter& out) const {
  steps_.save(out);
  out.put<uint64_t>(hosted_.size());
  for (uint32_t i = 0; i < hosted_.size(); ++i) {
    const HostedKind& kind = *hosted_[i];
    out.put(static_cast<uint8_t>(kind.tag()));
    kind.save_head(out);
    steps_.track(VariableId(i)).save(out);
    kind.save_sums(out);
  }
}

uint64_t VariableShard::freeze_rows(ShardDurability::RowsEmit emit) {
  uint64_t bytes = 0;
  for (const auto& kind : hosted_) bytes += kind->freeze(bytes, emit);
  saving_ = 0;
  return bytes;
}

bool VariableShard::save_rows() {
  for (; saving_ < hosted_.size(); ++saving_)
    if (hosted_[saving_]->save_chunk()) return true;
  return false;
}

void VariableShard::load_variables(ByteReader& in, ByteSource& rows) {
  steps_.load(in);
  const uint64_t count = in.get<uint64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    const VariableId id = add(restore_kind(in, rows, apply_pool_, device_));
    steps_.load_track(id, in);
    hosted_[id.value]->load_sums(in);
  }
}

void VariableShard::replay_register(VariableSpec& spec, ElementRange part,
                                    std::span<const std::byte> initial) {
  enroll(*enroll_variable(spec, part, initial, apply_pool_, device_));
}

void VariableShard::replay_register_table(TableSpec& spec) {
  enroll(*enroll_table(spec));
}

void VariableShard::replay_push(const Push& push) {
  take_push(push, [](const Result<>& taken) {
    if (!taken) throw taken.error();
  });
}

}  // namespace psched
