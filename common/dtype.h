// SPDX-License-Identifier: Apache-2.0
// Element types a variable may hold.
#pragma once

#include <cstddef>
#include <string_view>

namespace psched {

enum class DType : uint8_t {
  float32,  ///< IEEE 754 binary32
  float64,  ///< IEEE 754 binary64
};

constexpr size_t element_bytes(DType t) {
  return t == DType::float32 ? 4 : 8;
}

constexpr std::string_view to_string(DType t) {
  return t == DType::float32 ? "float32" : "float64";
}

// Calls `f(T{})` with T the C++ type of `t`.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  if (t == DType::float32) return f(float{});
  return f(double{});
}

}  // namespace psched
