// SPDX-License-Identifier: Apache-2.0
// For doctest suites: what a call that should be refused says, and its code.
#pragma once

#include <string>

#include <doctest/doctest.h>

#include "common/error.h"

namespace psched::testing {

// The message of the psched::Error `f()` throws, checking that its code is `code`; "" when
// `f()` throws none (so a test asserting on the message fails on an accepted call too).
inline std::string refusal(ErrorCode code, auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return "";
}

// The code of the psched::Error `f()` throws; fails the test when it throws none.
inline ErrorCode code_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no psched::Error thrown");
  return ErrorCode::internal;
}

}  // namespace psched::testing
