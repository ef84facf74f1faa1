// SPDX-License-Identifier: Apache-2.0
// The index a cluster engine gives a process in its environment: Slurm's task id
// (SLURM_PROCID), torchrun's RANK, or the ordinal at the end of a StatefulSet pod's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace psched {

// The index in `value`, the content of the environment variable `name`: a decimal number
// ("3"), or a name ending in '-' and one ("psched-shard-3"). Throws Error(bad_config) naming
// the variable, its value and what was expected when it is neither.
uint32_t parse_environment_index(std::string_view name, std::string_view value);

// parse_environment_index() of the variable `name`; when it is not set, throws
// Error(bad_config) saying what could not be told (`what`, "no shard index") and the variable.
uint32_t environment_index(const std::string& name, std::string_view what);

// The variable's index, or nothing when it is not set.
std::optional<uint32_t> optional_environment_index(const std::string& name);

}  // namespace psched
