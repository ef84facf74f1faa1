// SPDX-License-Identifier: Apache-2.0
// What a worker registers for an embedding table: rows of `dim` elements with ids below
// `num_embeddings`, their optimizer, and how a row starts. Every shard holds the rows whose ids
// the table's placement gives it (common/placement.h), all of them in one RowTable
// (actors/shard/row_table.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"
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

struct TableSpec {
  std::string name;
  uint64_t num_embeddings = 0;  // ids run from 0 to num_embeddings - 1
  uint32_t dim = 0;             // elements per row
  DType dtype = DType::float32;
  Priority priority;  // lower is more urgent (scheduling hint; the first registration's stays)
  optim::RowOptimizerSpec optimizer;
  RowInit init;
  uint64_t seed = 0;

  uint64_t row_bytes() const { return uint64_t{dim} * element_bytes(dtype); }
  // Same table for registration purposes: everything but the priority.
  bool same_table(const TableSpec& o) const {
    return name == o.name && num_embeddings == o.num_embeddings && dim == o.dim &&
           dtype == o.dtype && optimizer == o.optimizer && init == o.init && seed == o.seed;
  }
};

}  // namespace psched
