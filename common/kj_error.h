// SPDX-License-Identifier: Apache-2.0
// psched::Error and KJ exceptions, both ways: what crosses a Cap'n Proto call or a KJ promise
// is a kj::Exception whose description is "[code] message" and whose type follows the code's
// category (failed, overloaded, disconnected, unimplemented).
#pragma once

#include <exception>
#include <string>
#include <string_view>

#include <kj/exception.h>

#include "common/error.h"

namespace psched {

// "[code] message": an error as it crosses the wire (an RPC exception's description, a data
// stream's error answer).
std::string describe(const Error& error);
// The error `text` describes ("[code] message", as describe() writes); text without a code
// is an [internal] error.
Error from_description(std::string_view text);
// The exception a shard answers a failed call with.
kj::Exception to_kj_exception(const Error& error);
// The same for any exception (psched::Error keeps its code, other std::exceptions become
// [internal]).
kj::Exception to_kj_exception(std::exception_ptr error);
// What a client raises for a failed call: psched::Error with the server's code and message
// (disconnected when the peer went away).
Error from_kj_exception(const kj::Exception& exception);

}  // namespace psched
