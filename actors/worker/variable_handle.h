// SPDX-License-Identifier: Apache-2.0
// VariableHandle, TableHandle: how a trainer names a variable or table it registered with its
// Client. KJ-free, so client/client.h can hand it out without exposing the worker's actors.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace psched {

// A client-local handle for a registered variable (index in registration order).
using VariableHandle = Strong<struct VariableHandleTag, uint32_t>;
// A client-local handle for a registered embedding table (index in registration order).
using TableHandle = Strong<struct TableHandleTag, uint32_t>;

}  // namespace psched
