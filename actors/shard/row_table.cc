// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_table.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/durability/state_codec.h"
#include "actors/shard/row_init.h"
#include "actors/shard/row_order.h"
#include "common/check.h"
#include "common/error.h"

namespace psched {
namespace {

template <typename T>
std::span<T> as_span(std::byte* bytes, uint64_t n) {
  return {reinterpret_cast<T*>(bytes), n};
}

template <typename T>
std::span<const T> as_span(const std::byte* bytes, uint64_t n) {
  return {reinterpret_cast<const T*>(bytes), n};
}

void check_init(const TableSpec& spec) {
  const RowInit& init = spec.init;
  if (!std::isfinite(init.a) || !std::isfinite(init.b))
    fail(ErrorCode::invalid_argument, "table '{}': init bounds {} and {} must be finite", spec.name,
         init.a, init.b);
  if (init.kind == RowInit::Kind::uniform && !(init.a < init.b))
    fail(ErrorCode::invalid_argument, "table '{}': init ('uniform', {}, {}) needs low < high",
         spec.name, init.a, init.b);
  if (init.kind == RowInit::Kind::normal && init.b < 0)
    fail(ErrorCode::invalid_argument,
         "table '{}': init ('normal', {}, {}) needs a standard deviation >= 0", spec.name, init.a,
         init.b);
}

// Asks for every cache line of `bytes` bytes at `from`, to be written (kWrite = 1) or read (0).
template <int kWrite>
void ask_lines(const std::byte* from, uint64_t bytes) {
  constexpr uintptr_t kLine = 64;
  const auto* begin = reinterpret_cast<const char*>(from);
  for (const char* at = begin - reinterpret_cast<uintptr_t>(begin) % kLine; at < begin + bytes;
       at += kLine)
    __builtin_prefetch(at, kWrite);
}

}  // namespace

void RowTable::check_spec(const TableSpec& spec) {
  if (spec.num_embeddings == 0 || spec.dim == 0)
    fail(ErrorCode::invalid_argument,
         "table '{}': {} rows of {} elements (both must be at least 1)", spec.name,
         spec.num_embeddings, spec.dim);
  optim::validate_row(spec.optimizer);
  check_init(spec);
  if (spec.admit_after > RowCapacity::kMaxAdmitAfter)
    fail(ErrorCode::invalid_argument, "table '{}': admit_after {} (0 to {})", spec.name,
         spec.admit_after, RowCapacity::kMaxAdmitAfter);
  if (spec.max_rows > RowCapacity::kNone - 1)
    fail(ErrorCode::invalid_argument, "table '{}': max_rows {} (at most {} a shard)", spec.name,
         spec.max_rows, RowCapacity::kNone - 1);
}

void RowTable::declare(TableSpec& spec, const TableConfig& declared) {
  auto conflict = [&](std::string_view field, const auto& registered, const auto& configured) {
    fail(ErrorCode::spec_conflict,
         "register of table '{}' rejected: {} {} but the deployment's tables: entry says {}",
         spec.name, field, registered, configured);
  };
  if (declared.dim && *declared.dim != spec.dim) conflict("dim", spec.dim, *declared.dim);
  const std::string_view optimizer = optim::to_string(spec.optimizer.kind);
  if (declared.optimizer && *declared.optimizer != optimizer)
    conflict("optimizer", optimizer, *declared.optimizer);
  if (declared.init) {
    const std::string_view kind = to_string(spec.init.kind);
    const std::vector<double> values = spec.init.kind == RowInit::Kind::zeros
                                           ? std::vector<double>{}
                                           : std::vector<double>{spec.init.a, spec.init.b};
    if (kind != *declared.init || values != declared.init_values)
      conflict("init", fmt::format("{} {}", kind, values),
               fmt::format("{} {}", *declared.init, declared.init_values));
  }
  if (spec.max_rows == 0) spec.max_rows = declared.max_rows;
  if (spec.admit_after == 0) spec.admit_after = declared.admit_after;
}

RowTable::RowTable(TableSpec spec)
    : spec_(std::move(spec)),
      state_elements_(optim::row_state_elements(spec_.optimizer, spec_.dim)),
      block_bytes_((spec_.dim + state_elements_) * element_bytes(spec_.dtype)),
      capacity_(spec_) {}

void RowTable::check_rows(const char* what, std::span<const uint64_t> ids, DType dtype,
                          uint64_t bytes) const {
  if (dtype != spec_.dtype)
    fail(ErrorCode::dtype_mismatch, "{} of table '{}' rejected: dtype {} but registered as {}",
         what, spec_.name, to_string(dtype), to_string(spec_.dtype));
  if (bytes != ids.size() * spec_.row_bytes())
    fail(ErrorCode::shape_mismatch,
         "{} of table '{}' rejected: {} bytes for {} rows of {} elements of {} (expected {})", what,
         spec_.name, bytes, ids.size(), spec_.dim, to_string(dtype),
         ids.size() * spec_.row_bytes());
  for (uint64_t id : ids)
    if (id >= spec_.num_embeddings)
      fail(ErrorCode::offset_out_of_range,
           "{} of table '{}' rejected: id {} is not below its {} rows (nothing applied)", what,
           spec_.name, id, spec_.num_embeddings);
}

ElementRange RowTable::check_push(const Push& push) const {
  if (!push.rows)
    fail(ErrorCode::unknown_variable, "push rejected: id {} is table '{}', not a dense variable",
         push.variable.value, spec_.name);
  check_rows("push", push.ids, push.dtype, push.data.size());
  return kUnit;
}

ElementRange RowTable::check_poll(const char* what, const Poll& poll) const {
  if (!poll.rows)
    fail(ErrorCode::unknown_variable, "{} rejected: id {} is table '{}', not a dense variable",
         what, poll.variable.value, spec_.name);
  check_rows("pull", poll.ids, spec_.dtype, poll.ids.size() * spec_.row_bytes());
  return kUnit;
}

void RowTable::take(const StepUpdate& update, const Push& push) {
  PSCHED_REQUIRE(update.pieces.size() == 1 && update.pieces[0].range == kUnit,
                 update.pieces.size());
  if (!update.gathered) return apply(push.ids, push.data, update.t);
  gather(push.ids, push.data);
  const StepPiece& piece = update.pieces[0];
  if (piece.complete) apply_sums(piece.pushers + 1, update.t);
}

void RowTable::apply_gathered(const StepUpdate& update) {
  for (const StepPiece& piece : update.pieces)
    if (piece.complete && piece.pushers > 0) apply_sums(piece.pushers, update.t);
}

uint64_t RowTable::answer_bytes(const Poll& poll) const {
  return poll.ids.size() * spec_.row_bytes();
}

void RowTable::read(const Poll& poll, std::span<std::byte> out) const {
  read(poll.ids, out);
}

void RowTable::report(ShardStats& stats) const {
  ++stats.tables;
  stats.table_stats.push_back({spec_.name, rows(), bytes_held(), payload_bytes(),
                               rows() + capacity_.evictions(), rows_pushed_, rows_pulled_,
                               spec_.max_rows, capacity_.evictions(), capacity_.dropped()});
}

void RowTable::gather(std::span<const uint64_t> ids, std::span<const std::byte> gradients) {
  StepSums& sums = gathered_;
  const uint64_t row_bytes = spec_.row_bytes();
  for (size_t k = 0; k < ids.size(); ++k) {
    const auto emplaced = sums.position.try_emplace(ids[k], static_cast<uint32_t>(sums.ids.size()));
    const uint32_t row = emplaced.first->second;
    const std::byte* gradient = gradients.data() + k * row_bytes;
    if (emplaced.second) {
      sums.ids.push_back(ids[k]);
      sums.sums.insert(sums.sums.end(), gradient, gradient + row_bytes);
      continue;
    }
    visit_dtype(spec_.dtype, [&](auto zero) {
      using T = decltype(zero);
      auto sum = as_span<T>(sums.sums.data() + row * row_bytes, spec_.dim);
      auto more = as_span<T>(gradient, spec_.dim);
      for (uint32_t i = 0; i < spec_.dim; ++i) sum[i] += more[i];
    });
  }
}

void RowTable::apply_sums(uint32_t gradients, uint64_t t) {
  StepSums sums = std::exchange(gathered_, {});
  const uint64_t row_bytes = spec_.row_bytes();
  const optim::RowStep step = optim::row_step(spec_.optimizer, t);
  std::vector<uint32_t> order(sums.ids.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return sums.ids[a] < sums.ids[b]; });
  std::vector<RowUpdate> updates;
  updates.reserve(order.size());
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T scale = T(1) / static_cast<T>(gradients);
    for (uint32_t row : order) {
      std::byte* sum = sums.sums.data() + row * row_bytes;
      if (gradients > 1)
        for (T& x : as_span<T>(sum, spec_.dim)) x *= scale;
      updates.push_back({sums.ids[row], sum});
    }
  });
  update_all(updates, step);
}

void RowTable::apply(std::span<const uint64_t> ids, std::span<const std::byte> gradients,
                     uint64_t t) {
  const uint64_t row_bytes = spec_.row_bytes();
  PSCHED_REQUIRE(gradients.size() == ids.size() * row_bytes, gradients.size(), ids.size());
  const optim::RowStep step = optim::row_step(spec_.optimizer, t);
  // The rows in id order, duplicates next to each other, each id's in the order given.
  const std::vector<uint32_t> order = order_by_id(ids);
  size_t repeated = 0;  // ids given more than once: their sums need room of their own
  for (size_t k = 1; k < order.size(); ++k)
    repeated +=
        ids[order[k]] == ids[order[k - 1]] && (k == 1 || ids[order[k - 1]] != ids[order[k - 2]]);
  std::vector<std::byte> summed(repeated * row_bytes);
  size_t sums_used = 0;
  std::vector<RowUpdate> updates;
  updates.reserve(order.size());
  for (size_t k = 0; k < order.size();) {
    size_t end = k + 1;
    while (end < order.size() && ids[order[end]] == ids[order[k]]) ++end;
    const std::byte* gradient = gradients.data() + order[k] * row_bytes;
    if (end - k > 1) {  // duplicates: their sum
      std::byte* sum_bytes = summed.data() + sums_used++ * row_bytes;
      std::memcpy(sum_bytes, gradient, row_bytes);
      visit_dtype(spec_.dtype, [&](auto zero) {
        using T = decltype(zero);
        auto sum = as_span<T>(sum_bytes, spec_.dim);
        for (size_t d = k + 1; d < end; ++d) {
          auto more = as_span<T>(gradients.data() + order[d] * row_bytes, spec_.dim);
          for (uint32_t i = 0; i < spec_.dim; ++i) sum[i] += more[i];
        }
      });
      gradient = sum_bytes;
    }
    updates.push_back({ids[order[k]], gradient});
    k = end;
  }
  update_all(updates, step);
}

void RowTable::update_all(std::span<const RowUpdate> updates, const optim::RowStep& step) {
  if (spec_.max_rows == 0 || rows() + updates.size() <= spec_.max_rows)
    return update_ahead(updates, step);
  // This batch may reach max_rows: each row's slot is found just before its update, as a later
  // row's eviction could take an earlier row's slot before that row's update.
  for (size_t k = 0; k < updates.size(); ++k) {
    if (k + 1 < updates.size()) index_.prefetch(updates[k + 1].id);
    const uint32_t slot = slot_of(updates[k].id);
    update(updates.subspan(k, 1), {&slot, 1}, step);
  }
}

void RowTable::update_ahead(std::span<const RowUpdate> updates, const optim::RowStep& step) {
  const size_t n = updates.size();
  std::vector<uint32_t> slots(n);
  for (size_t k = 0; k < std::min(n, kIndexAhead); ++k) index_.prefetch(updates[k].id);
  for (size_t k = 0; k < n; ++k) {
    if (k + kIndexAhead < n) index_.prefetch(updates[k + kIndexAhead].id);
    slots[k] = slot_of(updates[k].id);
  }
  auto ask_rows = [&](size_t begin) {
    for (size_t k = begin; k < std::min(n, begin + kUpdateBlock); ++k)
      if (slots[k] != RowCapacity::kNone) ask_row(slots[k], updates[k].gradient);
  };
  ask_rows(0);
  for (size_t begin = 0; begin < n; begin += kUpdateBlock) {
    ask_rows(begin + kUpdateBlock);
    const size_t rows = std::min(n - begin, kUpdateBlock);
    update(updates.subspan(begin, rows), std::span(slots).subspan(begin, rows), step);
  }
}

void RowTable::ask_row(uint32_t slot, const std::byte* gradient) const {
  ask_lines<1>(block(slot), block_bytes_);
  ask_lines<0>(gradient, spec_.row_bytes());
}

void RowTable::update(std::span<const RowUpdate> updates, std::span<const uint32_t> slots,
                      const optim::RowStep& step) {
  PSCHED_REQUIRE(updates.size() == slots.size() && slots.size() <= kUpdateBlock, slots.size());
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    std::array<T*, kUpdateBlock> rows{};
    std::array<const T*, kUpdateBlock> gradients{};
    size_t admitted = 0;
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] == RowCapacity::kNone) continue;  // not admitted yet: dropped
      keep_frozen(slots[k]);
      rows[admitted] = reinterpret_cast<T*>(block(slots[k]));
      gradients[admitted++] = reinterpret_cast<const T*>(updates[k].gradient);
    }
    optim::apply_rows(spec_.optimizer, step, spec_.dim, std::span(rows).first(admitted),
                      std::span(gradients).first(admitted));
  });
}

void RowTable::read(std::span<const uint64_t> ids, std::span<std::byte> out) const {
  const uint64_t row_bytes = spec_.row_bytes();
  PSCHED_REQUIRE(out.size() == ids.size() * row_bytes, out.size(), ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    std::span<std::byte> into = out.subspan(k * row_bytes, row_bytes);
    const uint32_t slot = index_.find(ids[k]);
    if (slot == RowIndex::kNone)
      initial_row(ids[k], into);
    else
      std::memcpy(into.data(), block(slot), row_bytes);
  }
}

void RowTable::initial_row(uint64_t id, std::span<std::byte> out) const {
  psched::initial_row(spec_, id, out);
}

std::byte* RowTable::block(uint32_t slot) {
  return chunks_[slot / kRowsPerChunk].data() + uint64_t{slot % kRowsPerChunk} * block_bytes_;
}

const std::byte* RowTable::block(uint32_t slot) const {
  return chunks_[slot / kRowsPerChunk].data() + uint64_t{slot % kRowsPerChunk} * block_bytes_;
}

uint32_t RowTable::new_slot(uint64_t id) {
  const auto slot = static_cast<uint32_t>(ids_.size());
  index_.insert(id, slot);
  ids_.push_back(id);
  if (slot / kRowsPerChunk == chunks_.size()) chunks_.emplace_back(kRowsPerChunk * block_bytes_);
  return slot;
}

void RowTable::keep_frozen(uint32_t slot) {
  if (freeze_ && slot < freeze_->rows && !freeze_->saved[slot / kRowsPerChunk] &&
      !freeze_->kept[slot])
    keep_before(slot);  // the stream gets the row as it was at the freeze
}

uint32_t RowTable::slot_of(uint64_t id) {
  if (const uint32_t found = index_.find(id); found != RowIndex::kNone) {
    capacity_.touched(found);
    return found;
  }
  if (!capacity_.admit(id)) return RowCapacity::kNone;
  uint32_t slot = 0;
  if (capacity_.full(rows())) {  // the least recently updated row gives its slot
    slot = capacity_.oldest();
    keep_frozen(slot);
    index_.erase(ids_[slot]);
    ids_[slot] = id;
    index_.insert(id, slot);
    capacity_.touched(slot);
    capacity_.evicted();
  } else {
    slot = new_slot(id);
    capacity_.added(slot);
  }
  std::byte* row = block(slot);
  initial_row(id, {row, spec_.row_bytes()});
  const double state = optim::initial_row_state(spec_.optimizer);
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    for (T& x : as_span<T>(row + spec_.row_bytes(), state_elements_)) x = static_cast<T>(state);
  });
  return slot;
}

uint64_t RowTable::bytes_held() const {
  return chunks_.size() * kRowsPerChunk * block_bytes_ + index_.bytes_held() +
         ids_.capacity() * sizeof(uint64_t) + capacity_.bytes_held();
}

uint64_t RowTable::growth_bytes(std::span<const uint64_t> ids) const {
  uint64_t fresh = 0;
  for (uint64_t id : ids) fresh += !index_.contains(id);
  if (spec_.max_rows != 0)
    fresh = std::min(fresh, spec_.max_rows - std::min(spec_.max_rows, rows()));
  if (fresh == 0) return 0;
  const uint64_t rows_after = rows() + fresh;
  const uint64_t chunks_after = (rows_after + kRowsPerChunk - 1) / kRowsPerChunk;
  uint64_t bytes = (chunks_after - std::min<uint64_t>(chunks_after, chunks_.size())) *
                   kRowsPerChunk * block_bytes_;
  bytes += fresh * (sizeof(uint64_t) + (spec_.max_rows ? 2 * sizeof(uint32_t) : 0));
  return bytes + index_.bytes_holding(rows_after) - index_.bytes_held();
}

void RowTable::save_head(ByteWriter& out) const {
  save_head(out, spec_, ids_.size(), capacity_);
}

void RowTable::save_head(ByteWriter& out, const TableSpec& spec, uint64_t rows,
                         const RowCapacity& capacity) {
  encode_table_spec(out, spec);
  out.put<uint64_t>(rows);
  capacity.save(out, rows);
}

uint64_t RowTable::freeze(uint64_t base, Emit emit) {
  PSCHED_REQUIRE(!freeze_, spec_.name);
  const auto rows = static_cast<uint32_t>(ids_.size());
  if (rows == 0) return 0;
  const uint32_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  freeze_ = Freeze{rows,
                   base,
                   std::move(emit),
                   std::vector<bool>(chunks),
                   0,
                   std::vector<bool>(rows),
                   std::vector<std::vector<std::byte>>(chunks)};
  return uint64_t{rows} * (sizeof(uint64_t) + block_bytes_);
}

void RowTable::keep_before(uint32_t slot) {
  std::vector<std::byte>& before = freeze_->before[slot / kRowsPerChunk];
  const size_t at = before.size();
  before.resize(at + kKeptHead + block_bytes_);
  std::memcpy(before.data() + at, &slot, sizeof slot);
  std::memcpy(before.data() + at + sizeof slot, &ids_[slot], sizeof(uint64_t));
  std::memcpy(before.data() + at + kKeptHead, block(slot), block_bytes_);
  freeze_->kept[slot] = true;
}

bool RowTable::save_chunk() {
  if (!freeze_) return false;
  while (freeze_->next < freeze_->saved.size() && freeze_->saved[freeze_->next]) ++freeze_->next;
  if (freeze_->next == freeze_->saved.size()) {
    freeze_.reset();
    return false;
  }
  save_frozen(freeze_->next);
  return true;
}

void RowTable::save_frozen(uint32_t chunk) {
  const uint64_t record = sizeof(uint64_t) + block_bytes_;
  const uint32_t begin = chunk * kRowsPerChunk;
  const uint32_t end = std::min(freeze_->rows, begin + kRowsPerChunk);
  std::vector<std::byte> rows((end - begin) * record);
  for (uint32_t slot = begin; slot < end; ++slot) {
    std::byte* at = rows.data() + (slot - begin) * record;
    std::memcpy(at, &ids_[slot], sizeof(uint64_t));
    std::memcpy(at + sizeof(uint64_t), block(slot), block_bytes_);
  }
  std::vector<std::byte> before = std::exchange(freeze_->before[chunk], {});
  for (size_t at = 0; at < before.size(); at += kKeptHead + block_bytes_) {
    uint32_t slot = 0;
    std::memcpy(&slot, before.data() + at, sizeof slot);
    // Its id and row as at the freeze (an eviction since gave the slot to another id).
    std::memcpy(rows.data() + (slot - begin) * record, before.data() + at + sizeof slot,
                kKeptHead - sizeof slot + block_bytes_);
  }
  freeze_->saved[chunk] = true;
  freeze_->emit(freeze_->base + begin * record, std::move(rows));
}

void RowTable::save_sums(ByteWriter& out) const {
  out.put<uint64_t>(gathered_.ids.size());
  for (uint64_t id : gathered_.ids) out.put(id);
  out.raw(gathered_.sums);
}

void RowTable::load_sums(ByteReader& in) {
  const uint64_t rows = in.get<uint64_t>();
  std::vector<uint64_t> ids;
  for (uint64_t k = 0; k < rows; ++k) {
    ids.push_back(in.get<uint64_t>());
    if (ids.back() >= spec_.num_embeddings)
      fail(ErrorCode::corrupt_checkpoint, "{}: table '{}' gathered row {} of {}", in.what(),
           spec_.name, ids.back(), spec_.num_embeddings);
  }
  gathered_ = {};
  gather(ids, in.take(rows * spec_.row_bytes()));
}

RowTable RowTable::restore_head(ByteReader& in, uint64_t& rows) {
  TableSpec spec = decode_table_spec(in);
  try {
    check_spec(spec);
  } catch (const Error& e) {
    fail(ErrorCode::corrupt_checkpoint, "{}: {}", in.what(), e.what());
  }
  rows = in.get<uint64_t>();
  if (rows > spec.num_embeddings)
    fail(ErrorCode::corrupt_checkpoint, "{}: table '{}' holds {} rows of {}", in.what(), spec.name,
         rows, spec.num_embeddings);
  RowTable table(std::move(spec));
  table.capacity_.load(in, rows);
  return table;
}

RowTable RowTable::restore(ByteReader& head, ByteSource& rows) {
  uint64_t count = 0;
  RowTable table = restore_head(head, count);
  table.index_.reserve(count);
  table.ids_.reserve(count);
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t id = 0;
    rows.read(std::as_writable_bytes(std::span(&id, 1)));
    if (id >= table.spec_.num_embeddings || table.index_.contains(id))
      fail(ErrorCode::corrupt_checkpoint, "{}: table '{}' holds row {} twice or past its {} rows",
           head.what(), table.spec_.name, id, table.spec_.num_embeddings);
    rows.read({table.block(table.new_slot(id)), table.block_bytes_});
  }
  return table;
}

}  // namespace psched
