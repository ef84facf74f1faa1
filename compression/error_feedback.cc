// SPDX-License-Identifier: Apache-2.0
#include "compression/error_feedback.h"

#include <cstring>

#include "common/check.h"
#include "compression/codec.h"

namespace psched {
namespace {

// The UInt32 at byte `at` of a body (codec.h: a topk body's k at 4, its indices from 8).
uint32_t word(const std::vector<std::byte>& body, size_t at) {
  uint32_t value;
  std::memcpy(&value, body.data() + at, sizeof value);
  return value;
}

}  // namespace

void encode_with_feedback(WireFormat format, DType dtype, std::span<const std::byte> gradient,
                          std::span<std::byte> residual, const TopK& topk,
                          std::vector<std::byte>& body, std::vector<std::byte>& scratch) {
  PSCHED_REQUIRE(gradient.size() == residual.size(), gradient.size(), residual.size());
  visit_dtype(dtype, [&]<typename T>(T) {
    const size_t n = gradient.size() / sizeof(T);
    const T* g = reinterpret_cast<const T*>(gradient.data());
    T* r = reinterpret_cast<T*>(residual.data());
    if (format == WireFormat::topk) {  // the residual holds what is owed now, then what is kept
      encode_topk_adding(dtype, gradient, residual, topk, body);
      const uint32_t k = word(body, 4);  // each element sent whole, owed nothing more
      for (uint32_t i = 0; i < k; ++i) r[word(body, 8 + 4 * size_t{i})] = T(0);
      return;
    }
    for (size_t i = 0; i < n; ++i) r[i] += g[i];  // the residual holds what is owed now
    encode(format, dtype, residual, topk, body);
    scratch.resize(residual.size());
    decode(format, dtype, body, scratch);
    const T* sent = reinterpret_cast<const T*>(scratch.data());
    for (size_t i = 0; i < n; ++i) r[i] -= sent[i];
  });
}

}  // namespace psched
