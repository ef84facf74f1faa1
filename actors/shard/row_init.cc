// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/row_init.h"

#include <cmath>
#include <numbers>

#include "common/check.h"

namespace psched {
namespace {

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

}  // namespace

void initial_row(const TableSpec& spec, uint64_t id, std::span<std::byte> out) {
  PSCHED_REQUIRE(out.size() == spec.row_bytes(), out.size(), spec.row_bytes());
  const uint64_t key = mix64(spec.seed ^ mix64(id));
  visit_dtype(spec.dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* row = reinterpret_cast<T*>(out.data());
    for (uint32_t j = 0; j < spec.dim; ++j)
      row[j] = static_cast<T>(initial_element(spec.init, key, j));
  });
}

}  // namespace psched
