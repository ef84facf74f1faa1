// SPDX-License-Identifier: Apache-2.0
#include "compression/error_feedback.h"

#include "common/check.h"
#include "compression/codec.h"

namespace psched {

void encode_with_feedback(WireFormat format, DType dtype, std::span<const std::byte> gradient,
                          std::span<std::byte> residual, const TopK& topk,
                          std::vector<std::byte>& body, std::vector<std::byte>& scratch) {
  PSCHED_REQUIRE(gradient.size() == residual.size(), gradient.size(), residual.size());
  if (format == WireFormat::topk)  // one pass, and each element sent whole or kept whole
    return encode_topk_with_feedback(dtype, gradient, residual, topk, body);
  visit_dtype(dtype, [&]<typename T>(T) {
    const size_t n = gradient.size() / sizeof(T);
    const T* g = reinterpret_cast<const T*>(gradient.data());
    T* r = reinterpret_cast<T*>(residual.data());
    for (size_t i = 0; i < n; ++i) r[i] += g[i];  // the residual holds what is owed now
    encode(format, dtype, residual, topk, body);
    scratch.resize(residual.size());
    decode(format, dtype, body, scratch);
    const T* sent = reinterpret_cast<const T*>(scratch.data());
    for (size_t i = 0; i < n; ++i) r[i] -= sent[i];
  });
}

}  // namespace psched
