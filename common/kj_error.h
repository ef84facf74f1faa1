// SPDX-License-Identifier: Apache-2.0
// psched::Error and KJ exceptions, both ways: what crosses a Cap'n Proto call or a KJ promise
// is a kj::Exception whose description is "[code] message" and whose type follows the code's
// category (failed, overloaded, disconnected, unimplemented).
#pragma once

#include <exception>

#include <kj/exception.h>

#include "common/error.h"

namespace psched {

// The exception a shard answers a failed call with (any exception: psched::Error keeps its
// code, other std::exceptions become [internal]).
kj::Exception to_kj_exception(std::exception_ptr error);
// What a client raises for a failed call: psched::Error with the server's code and message
// (disconnected when the peer went away).
Error from_kj_exception(const kj::Exception& exception);

}  // namespace psched
