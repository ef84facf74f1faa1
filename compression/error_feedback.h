// SPDX-License-Identifier: Apache-2.0
// Error feedback: a lossy push format (topk, onebit) sends part of a gradient; the worker keeps
// the rest and adds it to the next step's gradient of the same elements, so over steps every
// bit of every gradient reaches the shard, late rather than never (Seide et al. 2014, 1-bit
// SGD; Stich et al. 2018, sparsified SGD with memory). For each element, at each step:
//   sent + residual_after == gradient + residual_before   (the right side rounded once)
// and for topk exactly, element by element: each element is either sent whole or kept whole.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "common/dtype.h"
#include "compression/wire_format.h"

namespace psched {

// Encodes `gradient` + `residual` (elements of `dtype`, the same count) as `format` into
// `body`, and leaves in `residual` what the body does not carry: that sum minus what a shard
// decodes from the body. `scratch` is working memory, reused between calls.
void encode_with_feedback(WireFormat format, DType dtype, std::span<const std::byte> gradient,
                          std::span<std::byte> residual, const TopK& topk,
                          std::vector<std::byte>& body, std::vector<std::byte>& scratch);

}  // namespace psched
