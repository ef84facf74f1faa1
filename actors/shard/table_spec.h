// SPDX-License-Identifier: Apache-2.0
// What a worker registers for an embedding table: rows of `dim` elements with ids below
// `num_embeddings`, their optimizer, and how a row starts. Every shard holds the rows whose slots
// the job's slot map gives it (common/slot_map.h), all of them in one RowTable
// (actors/shard/row_table.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/slot_map.h"
#include "common/types.h"
#include "optim/row_optimizer.h"

namespace psched {

// How a row starts: its value is a function of the table's seed and the row's id only (Persia's
// way), the same on any number of shards and whatever the order rows are first touched in.
struct RowInit {
  enum class Kind : uint8_t {
    zeros,
    uniform,  ///< uniform on [a, b)
    normal,   ///< mean a, standard deviation b
  };
  Kind kind = Kind::zeros;
  double a = 0;
  double b = 0;
  bool operator==(const RowInit&) const = default;
};

// A kind's name, as the wire, the deployment file and Python spell it.
inline constexpr std::string_view kRowInitKinds[] = {"zeros", "uniform", "normal"};
constexpr std::string_view to_string(RowInit::Kind kind) {
  return kRowInitKinds[static_cast<size_t>(kind)];
}
// Inverse of to_string; false when `name` names no kind.
constexpr bool parse_row_init_kind(std::string_view name, RowInit::Kind& out) {
  for (size_t k = 0; k < std::size(kRowInitKinds); ++k)
    if (kRowInitKinds[k] == name) {
      out = static_cast<RowInit::Kind>(k);
      return true;
    }
  return false;
}

// What places a table's rows: a 64-bit key of its name (FNV-1a), the same on every worker.
constexpr uint64_t table_key(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}
// The shard that holds row `id` of the table whose key is `key`: the owner, in the job's slot
// map, of the row's slot (common/slot_map.h).
inline uint32_t row_shard(uint64_t key, uint64_t id, const SlotMap& map) {
  return map.owner(row_slot(key, id));
}

struct TableSpec {
  std::string name;
  uint64_t num_embeddings = 0;  // ids run from 0 to num_embeddings - 1
  uint32_t dim = 0;             // elements per row
  DType dtype = DType::float32;
  Priority priority;  // lower is more urgent (scheduling hint; the first registration's stays)
  optim::RowOptimizerSpec optimizer;
  RowInit init;
  uint64_t seed = 0;
  // Capacity on each shard (actors/shard/row_capacity.h): at most max_rows rows stored (0: no
  // bound), the least recently updated evicted for a new one; a row stored from its
  // admit_after-th update on (0 and 1: its first), its earlier updates dropped.
  uint64_t max_rows = 0;
  uint32_t admit_after = 0;

  uint64_t row_bytes() const { return uint64_t{dim} * element_bytes(dtype); }
  // Every row's values, stored or not: num_embeddings x row_bytes(), UINT64_MAX past it. The
  // size a compression's min_bytes is compared with (compression/wire_format.h).
  uint64_t bytes() const {
    const uint64_t row = row_bytes();
    return row != 0 && num_embeddings > UINT64_MAX / row ? UINT64_MAX : num_embeddings * row;
  }
  // Same table for registration purposes: everything but the priority.
  bool same_table(const TableSpec& o) const {
    return name == o.name && num_embeddings == o.num_embeddings && dim == o.dim &&
           dtype == o.dtype && optimizer == o.optimizer && init == o.init && seed == o.seed &&
           max_rows == o.max_rows && admit_after == o.admit_after;
  }
};

}  // namespace psched
