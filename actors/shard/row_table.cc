// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>

#include "actors/durability/state_codec.h"
#include "common/check.h"
#include "common/error.h"

namespace psched {
namespace {

// SplitMix64's step: a bijection of 64-bit words whose outputs for consecutive inputs look
// independent (Steele, Lea, Flood 2014).
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A double on [0, 1) from the top 53 bits of `bits`.
double unit(uint64_t bits) {
  return double(bits >> 11) * 0x1.0p-53;
}

// Element `j` of the initial row whose stream is `key`, as a double.
double initial_element(const RowInit& init, uint64_t key, uint64_t j) {
  switch (init.kind) {
    case RowInit::Kind::zeros:
      return 0;
    case RowInit::Kind::uniform:
      return init.a + (init.b - init.a) * unit(mix64(key + j));
    case RowInit::Kind::normal: {  // Box-Muller on two draws of the element's own
      const double u1 = 1 - unit(mix64(key + 2 * j)), u2 = unit(mix64(key + 2 * j + 1));
      return init.a + init.b * std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
    }
  }
  return 0;
}

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

}  // namespace

void RowTable::check_spec(const TableSpec& spec) {
  if (spec.num_embeddings == 0 || spec.dim == 0)
    fail(ErrorCode::invalid_argument,
         "table '{}': {} rows of {} elements (both must be at least 1)", spec.name,
         spec.num_embeddings, spec.dim);
  optim::validate_row(spec.optimizer);
  check_init(spec);
}

RowTable::RowTable(TableSpec spec)
    : spec_(std::move(spec)),
      state_elements_(optim::row_state_elements(spec_.optimizer, spec_.dim)),
      block_bytes_((spec_.dim + state_elements_) * element_bytes(spec_.dtype)) {}

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

void RowTable::apply(std::span<const uint64_t> ids, std::span<const std::byte> gradients,
                     uint64_t t) {
  const uint64_t row_bytes = spec_.row_bytes();
  PSCHED_REQUIRE(gradients.size() == ids.size() * row_bytes, gradients.size(), ids.size());
  // The rows in id order, duplicates next to each other, each id's in the order given.
  std::vector<uint32_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
  std::vector<std::byte> summed;
  for (size_t k = 0; k < order.size();) {
    size_t end = k + 1;
    while (end < order.size() && ids[order[end]] == ids[order[k]]) ++end;
    const std::byte* gradient = gradients.data() + order[k] * row_bytes;
    if (end - k > 1) {  // duplicates: their sum
      summed.assign(gradient, gradient + row_bytes);
      visit_dtype(spec_.dtype, [&](auto zero) {
        using T = decltype(zero);
        auto sum = as_span<T>(summed.data(), spec_.dim);
        for (size_t d = k + 1; d < end; ++d) {
          auto more = as_span<T>(gradients.data() + order[d] * row_bytes, spec_.dim);
          for (uint32_t i = 0; i < spec_.dim; ++i) sum[i] += more[i];
        }
      });
      gradient = summed.data();
    }
    update(slot_of(ids[order[k]]), gradient, t);
    k = end;
  }
}

void RowTable::update(uint32_t slot, const std::byte* gradient, uint64_t t) {
  std::byte* row = block(slot);
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    optim::apply_row(spec_.optimizer, as_span<T>(row, spec_.dim), as_span<T>(gradient, spec_.dim),
                     as_span<T>(row + spec_.row_bytes(), state_elements_), t);
  });
}

void RowTable::read(std::span<const uint64_t> ids, std::span<std::byte> out) const {
  const uint64_t row_bytes = spec_.row_bytes();
  PSCHED_REQUIRE(out.size() == ids.size() * row_bytes, out.size(), ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    std::span<std::byte> into = out.subspan(k * row_bytes, row_bytes);
    auto found = index_.find(ids[k]);
    if (found == index_.end())
      initial_row(ids[k], into);
    else
      std::memcpy(into.data(), block(found->second), row_bytes);
  }
}

void RowTable::initial_row(uint64_t id, std::span<std::byte> out) const {
  PSCHED_REQUIRE(out.size() == spec_.row_bytes(), out.size());
  const uint64_t key = mix64(spec_.seed ^ mix64(id));
  visit_dtype(spec_.dtype, [&](auto zero) {
    using T = decltype(zero);
    auto row = as_span<T>(out.data(), spec_.dim);
    for (uint32_t j = 0; j < spec_.dim; ++j)
      row[j] = static_cast<T>(initial_element(spec_.init, key, j));
  });
}

std::byte* RowTable::block(uint32_t slot) {
  return chunks_[slot / kRowsPerChunk].data() + uint64_t{slot % kRowsPerChunk} * block_bytes_;
}

const std::byte* RowTable::block(uint32_t slot) const {
  return chunks_[slot / kRowsPerChunk].data() + uint64_t{slot % kRowsPerChunk} * block_bytes_;
}

uint32_t RowTable::slot_of(uint64_t id) {
  auto [found, made] = index_.try_emplace(id, static_cast<uint32_t>(index_.size()));
  const uint32_t slot = found->second;
  if (!made) return slot;
  if (slot / kRowsPerChunk == chunks_.size()) chunks_.emplace_back(kRowsPerChunk * block_bytes_);
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
  const uint64_t index = index_.capacity() * (sizeof(std::pair<uint64_t, uint32_t>) + 1);
  return chunks_.size() * kRowsPerChunk * block_bytes_ + index;
}

void RowTable::save(ByteWriter& out) const {
  encode_table_spec(out, spec_);
  out.put<uint64_t>(index_.size());
  std::vector<uint64_t> ids(index_.size());
  for (const auto& [id, slot] : index_) ids[slot] = id;
  for (uint32_t slot = 0; slot < ids.size(); ++slot) {
    out.put(ids[slot]);
    out.raw({block(slot), block_bytes_});
  }
}

RowTable RowTable::restore(ByteReader& in) {
  TableSpec spec = decode_table_spec(in);
  try {
    check_spec(spec);
  } catch (const Error& e) {
    fail(ErrorCode::corrupt_checkpoint, "{}: {}", in.what(), e.what());
  }
  RowTable table(std::move(spec));
  const uint64_t rows = in.get<uint64_t>();
  for (uint64_t k = 0; k < rows; ++k) {
    const uint64_t id = in.get<uint64_t>();
    if (id >= table.spec_.num_embeddings || table.index_.contains(id))
      fail(ErrorCode::corrupt_checkpoint, "{}: table '{}' holds row {} twice or past its {} rows",
           in.what(), table.spec_.name, id, table.spec_.num_embeddings);
    std::memcpy(table.block(table.slot_of(id)), in.take(table.block_bytes_).data(),
                table.block_bytes_);
  }
  return table;
}

}  // namespace psched
