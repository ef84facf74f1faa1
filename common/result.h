// SPDX-License-Identifier: Apache-2.0
// Result<T>: what became of a request on the data path, as a value: what it answers with, or
// the Error that refused it (and changed nothing). The one form a refusal takes between the
// shard and its front ends, and between a link and the scheduler; each front end converts it
// once, into its own wire's error (a Cap'n Proto exception, an error frame).
//
// Inside a unit, bad input still throws psched::Error (common/error.h) from deep in its
// checks; the unit's entry point catches it once and hands it on as a Result.
#pragma once

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/check.h"
#include "common/error.h"

namespace psched {

template <typename T = void>
class Result {
 public:
  Result(T value) : outcome_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
  Result(Error refusal) : outcome_(std::move(refusal)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return outcome_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // Requires ok().
  const T& value() const {
    PSCHED_REQUIRE(ok());
    return std::get<0>(outcome_);
  }
  const T& operator*() const { return value(); }
  const T* operator->() const { return &value(); }
  // Requires !ok().
  const Error& error() const {
    PSCHED_REQUIRE(!ok());
    return std::get<1>(outcome_);
  }

 private:
  std::variant<T, Error> outcome_;
};

template <>
class Result<void> {
 public:
  Result() = default;
  Result(Error refusal) : refusal_(std::move(refusal)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return !refusal_.has_value(); }
  explicit operator bool() const { return ok(); }
  // Requires !ok().
  const Error& error() const {
    PSCHED_REQUIRE(!ok());
    return *refusal_;
  }

 private:
  std::optional<Error> refusal_;
};

// The exception being handled as a refusal (other exceptions than psched::Error become
// [internal]): for the one catch at a unit's entry point.
inline Error caught() {
  return to_error(std::current_exception());
}

// Runs `request`, which throws to refuse: what it returns, or the refusal.
template <typename Request>
auto attempt(Request&& request) -> Result<std::invoke_result_t<Request>> {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Request>>) {
      request();
      return {};
    } else {
      return request();
    }
  } catch (...) {
    return caught();
  }
}

}  // namespace psched
