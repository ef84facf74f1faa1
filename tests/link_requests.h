// SPDX-License-Identifier: Apache-2.0
// One request at a time on a link's DataPath (link/data_path.h), for tests that send hand-made
// requests: each resolves with its answer or rejects with the shard's refusal as a
// kj::Exception (read it with from_kj_exception), as a Cap'n Proto call would.
#pragma once

#include <span>
#include <vector>

#include "link/shard_link.h"

namespace psched::testing {

kj::Promise<void> push(ShardLink& link, VariableId variable, Step step, ElementRange range,
                       DType dtype, std::span<const std::byte> gradient);
// Resolves with the shard's wall clock at the answer; `out` holds `out_bytes`, the range's.
kj::Promise<int64_t> poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                          std::byte* out, size_t out_bytes);
kj::Promise<int64_t> push_poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                               DType dtype, std::span<const std::byte> gradient, std::byte* out,
                               size_t out_bytes);

}  // namespace psched::testing
