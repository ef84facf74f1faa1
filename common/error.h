// SPDX-License-Identifier: Apache-2.0
// The two kinds of failure in psched.
//
// Bugs and broken preconditions: PSCHED_REQUIRE (check.h) throws with file, line and values.
// Expected outcomes (bad input, overload, disconnects): `Error`, carrying an `ErrorCode`. The
// codes are grouped by `ErrorCategory`, which net/ maps one-to-one onto Cap'n Proto's
// exception types, so a client gets the same code and message the server raised.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace psched {

enum class ErrorCategory {
  failed,         ///< the request is wrong; retrying it unchanged fails again
  overloaded,     ///< the server is busy; retrying later may succeed
  disconnected,   ///< the peer went away
  unimplemented,  ///< the peer does not support the request
};

enum class ErrorCode {
  unknown_variable,     ///< a push, poll or pull named a variable that is not registered
  shape_mismatch,       ///< data length or shape differs from the registered spec
  dtype_mismatch,       ///< data element type differs from the registered spec
  offset_out_of_range,  ///< a range reaches past the variable (or the shard's part of it)
  step_from_future,     ///< a push or poll for a step beyond the next one the shard expects
  stale_step,           ///< a push for a step that was already applied
  spec_conflict,        ///< re-registration of a name with a different spec
  bad_token,            ///< the auth token was wrong
  message_too_large,    ///< a message over the configured size limit
  invalid_argument,     ///< any other malformed request (bad name, bad optimizer setting, ...)
  bad_config,           ///< a deployment config that cannot be used
  corrupt_checkpoint,   ///< a checkpoint or update log that fails its checksum or cannot be read
  sync_timeout,         ///< sync mode: a step's workers did not all push within the timeout
  not_a_member,         ///< sync mode: a worker that left the job (or never joined) pushed
  overloaded,           ///< the server is out of capacity for now
  disconnected,         ///< the connection to a shard was lost
  unimplemented,        ///< the peer does not support the request
  io_error,             ///< the server could not write its update log or checkpoint (disk full,
                        ///< I/O error); the request was refused and changed nothing
  read_only,            ///< a push or a new registration sent to a shard that serves read-only
  internal,             ///< a bug on the server (a broken precondition); the message says where
};
// Number of ErrorCode values (they run from 0 to internal), for tables indexed by code.
inline constexpr size_t kErrorCodeCount = static_cast<size_t>(ErrorCode::internal) + 1;

constexpr ErrorCategory category(ErrorCode code) {
  switch (code) {
    case ErrorCode::overloaded:
      return ErrorCategory::overloaded;
    case ErrorCode::disconnected:
      return ErrorCategory::disconnected;
    case ErrorCode::unimplemented:
      return ErrorCategory::unimplemented;
    default:
      return ErrorCategory::failed;
  }
}

std::string_view to_string(ErrorCode code);
// Inverse of to_string; returns false when `name` is no code.
bool parse_error_code(std::string_view name, ErrorCode& out);

// An expected failure: a code and a message that says what was expected, the values, and where.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// The Error in `error`; any other exception becomes an `internal` Error with its what().
Error to_error(std::exception_ptr error);

// Throws Error(code, fmt::format(fmt, args...)).
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace psched
