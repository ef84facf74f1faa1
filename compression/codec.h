// SPDX-License-Identifier: Apache-2.0
// The bodies of compressed pushes and values: what a worker encodes and a shard decodes, the
// same bytes over the data stream and over Cap'n Proto calls. Integers and floats are
// little-endian; a body holds one partition of `n` elements of the variable's dtype:
//   none    the n elements as they are
//   bf16    n 16-bit values (compression/half.h)
//   fp16    n 16-bit values
//   topk    UInt32 n, UInt32 k, k UInt32 indices into the partition (ascending), then the k
//           values in the dtype: the k largest magnitudes, ties to the lower index; the rest 0
//   onebit  UInt32 n, the scale in the dtype (the mean magnitude), then ceil(n / 8) bytes of
//           signs (bit i % 8 of byte i / 8 set: element i is negative); element i is +-scale
// A shard decodes into the dtype before anything else reads the push, so every optimizer, the
// sync sum and the GPU apply see a plain gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/dtype.h"
#include "compression/wire_format.h"

namespace psched {

// Throws Error(invalid_argument) naming what is wrong with a trainer's `compression`: a pull
// format that does not carry values, a topk fraction outside (0, 1].
void check(const Compression& compression);

// Encodes `values` (elements of `dtype`) as `format` into `body`, replacing what it held (its
// memory is reused). Requires fewer than 2^32 elements for topk and onebit.
void encode(WireFormat format, DType dtype, std::span<const std::byte> values, const TopK& topk,
            std::vector<std::byte>& body);

// Error feedback's topk (compression/error_feedback.h): encode(topk) of `residual` +
// `gradient` (elements of `dtype`, the same count), the addition and the selection in one pass
// over both, leaving in `residual` that sum with the elements sent zeroed (each is sent whole).
void encode_topk_with_feedback(DType dtype, std::span<const std::byte> gradient,
                               std::span<std::byte> residual, const TopK& topk,
                               std::vector<std::byte>& body);

// Delta pulls (fresh values as top-k deltas from the shard, actors/shard/value_deltas.h). A
// delta body is laid out as a topk body, but its values are the elements' new values, not
// differences: applying it writes them and leaves the other elements as they are, so applying
// it twice, or an older one after a newer, never moves a copy off the values it was sent.
//
// The at most `k` elements where `current` and `published` (elements of `dtype`, the same
// count, under 2^32) differ most (|current - published|, ties to the lower index; none that are
// equal), with their current values, into `body`; their indices into `sent`, and their values
// into `published`. Selected as a topk push is (a sampled threshold, then the k largest).
void encode_delta(DType dtype, std::span<const std::byte> current, std::span<std::byte> published,
                  uint64_t k, std::vector<std::byte>& body, std::vector<uint32_t>& sent);
// The elements `indices` (ascending, inside `values`) of `values` as a delta body.
void encode_delta_at(DType dtype, std::span<const std::byte> values,
                     std::span<const uint32_t> indices, std::vector<std::byte>& body);
// Writes the values of the delta `body` into `out` (elements of `dtype`) at its indices,
// leaving the rest. Throws Error naming what is wrong, and writes nothing, when the body is
// malformed (as a topk body) or is not one of out's elements ([shape_mismatch]).
void apply_delta(DType dtype, std::span<const std::byte> body, std::span<std::byte> out);

// Writes `values` (elements of `dtype`) as `format` (none, bf16 or fp16: carries_values())
// into `out`, which holds encoded_bytes() of them (a fresh value, narrowed as it leaves).
void narrow_values(WireFormat format, DType dtype, std::span<const std::byte> values,
                   std::span<std::byte> out);

// The bytes `elements` take as `format` where that does not depend on the values (none, bf16,
// fp16); for topk and onebit, the most they take.
uint64_t encoded_bytes(WireFormat format, DType dtype, uint64_t elements);

// The elements `body` holds as `format`. Throws Error(invalid_argument) naming what is wrong
// when the body is not one (a size that does not fit, an index out of range or not ascending).
uint64_t decoded_elements(WireFormat format, DType dtype, std::span<const std::byte> body);

// Decodes `body` into `out`, which holds decoded_elements() elements of `dtype`. The body must
// have passed decoded_elements(). Writes every element of `out`.
void decode(WireFormat format, DType dtype, std::span<const std::byte> body,
            std::span<std::byte> out);

// Whether every element of `values` is finite (neither infinite nor NaN).
bool all_finite(DType dtype, std::span<const std::byte> values);
// Whether `body` (in `format`, one that passed decoded_elements()) decodes to finite elements
// only, read from the body itself: a topk body's values, a onebit body's scale, each 16-bit
// value's exponent (not all ones), the elements of a plain one.
bool decodes_finite(WireFormat format, DType dtype, std::span<const std::byte> body);

}  // namespace psched
