// SPDX-License-Identifier: Apache-2.0
// VariableShard's side of its durability (ShardDurability::State): what a checkpoint holds of
// the shard's variables and tables, and the update log's records made again.
#include "actors/durability/shard_store.h"
#include "actors/shard/variable_shard.h"
#include "common/error.h"

namespace psched {

// A checkpoint's payload after the step machine's record: the count of hosted ids, then each in
// id order. From ShardStore::kTablesFormat each starts with its kind; before, all are variables.
// A variable: its values, its track, its sums; a table: its spec and row count (with its rows
// in kTablesFormat; from kStreamedRowsFormat they are streamed after the payload,
// freeze_rows; from kCapacityFormat with its capacity), its track, its sums.
void VariableShard::save_variables(ByteWriter& out) const {
  steps_.save(out);
  out.put<uint64_t>(hosted_.size());
  for (uint32_t i = 0; i < hosted_.size(); ++i) save_hosted(out, VariableId(i));
}

void VariableShard::save_hosted(ByteWriter& out, VariableId id) const {
  const Hosted hosted = hosted_[id.value];
  out.put(static_cast<uint8_t>(hosted.kind));
  if (hosted.kind == Hosted::Kind::table) {
    tables_[hosted.index].save_head(out);
    steps_.track(id).save(out);
    return tables_[hosted.index].save_sums(out);
  }
  variables_[hosted.index].save_values(out);
  steps_.track(id).save(out);
  variables_[hosted.index].save_sums(out);
}

uint64_t VariableShard::freeze_rows(ShardDurability::RowsEmit emit) {
  uint64_t bytes = 0;
  for (RowTable& table : tables_) bytes += table.freeze(bytes, emit);
  saving_ = 0;
  return bytes;
}

bool VariableShard::save_rows() {
  for (; saving_ < tables_.size(); ++saving_)
    if (tables_[saving_].save_chunk()) return true;
  return false;
}

void VariableShard::load_variables(ByteReader& in, uint32_t checkpoint_format, ByteSource& rows) {
  if (checkpoint_format >= ShardStore::kMembershipFormat) steps_.load(in);
  const uint64_t count = in.get<uint64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    auto kind = Hosted::Kind::variable;
    if (checkpoint_format >= ShardStore::kTablesFormat) {
      const auto read = in.get<uint8_t>();
      if (read > static_cast<uint8_t>(Hosted::Kind::table))
        fail(ErrorCode::corrupt_checkpoint, "{}: unknown kind {} of id {}", in.what(), read, i);
      kind = static_cast<Hosted::Kind>(read);
    }
    load_hosted(in, kind, checkpoint_format, rows);
  }
  stats_.variables = variables_.size();
  stats_.tables = tables_.size();
}

void VariableShard::load_hosted(ByteReader& in, Hosted::Kind kind, uint32_t checkpoint_format,
                                ByteSource& rows) {
  if (kind == Hosted::Kind::table) {
    const bool capacity = checkpoint_format >= ShardStore::kCapacityFormat;
    RowTable table = checkpoint_format >= ShardStore::kStreamedRowsFormat
                         ? RowTable::restore(in, rows, capacity)
                         : RowTable::restore(in, capacity);
    const VariableId id = add_hosted(table.spec().name, kind, {0, table.spec().parts});
    steps_.load_track(id, in);
    table.load_sums(in);
    tables_.push_back(std::move(table));
    table_counts_.emplace_back();
    return;
  }
  const uint32_t format =
      checkpoint_format < ShardStore::kFrozenVarianceFormat ? 1 : Variable::kSaveFormat;
  Variable variable = Variable::restore_values(in, apply_pool_, device_);
  const VariableId id = add_hosted(variable.spec().name, kind, variable.part());
  steps_.load_track(id, in);
  variable.load_sums(in, format, steps_.track(id).updates());
  variables_.push_back(std::move(variable));
}

void VariableShard::replay_register(VariableSpec& spec, ElementRange part,
                                    std::span<const std::byte> initial) {
  do_register(spec, part, initial);
}

void VariableShard::replay_push(WorkerId worker, VariableId id, Step step, ElementRange range,
                                DType dtype, std::span<const std::byte> data,
                                PushedGradient gradient) {
  do_push({worker, id, step, range, dtype, data, gradient});
}

void VariableShard::replay_register_table(TableSpec& spec) {
  do_register_table(spec);
}

void VariableShard::replay_push_rows(WorkerId worker, VariableId table, Step step, DType dtype,
                                     std::span<const uint64_t> ids,
                                     std::span<const std::byte> data) {
  do_push_rows({worker, table, step, dtype, ids, data});
}

}  // namespace psched
