// SPDX-License-Identifier: Apache-2.0
// VariableHandle: how a trainer names a variable it registered with its Client. KJ-free, so
// client/client.h can hand it out without exposing the worker's actors.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace psched {

// A client-local handle for a registered variable (index in registration order).
using VariableHandle = Strong<struct VariableHandleTag, uint32_t>;

}  // namespace psched
