// SPDX-License-Identifier: Apache-2.0
#include "common/check.h"

#include <doctest/doctest.h>

#include "common/error.h"

TEST_CASE("a failed require names the condition and the values") {
  int a = 14, b = 72;
  try {
    PSCHED_REQUIRE(a == b, a, b);
    FAIL("no throw");
  } catch (const std::logic_error& e) {
    std::string what = e.what();
    CHECK(what.find("require failed: a == b; a = 14; b = 72") != std::string::npos);
    CHECK(what.find("check_test.cc") != std::string::npos);
  }
}

TEST_CASE("error codes round-trip through their names") {
  psched::ErrorCode code{};
  REQUIRE(psched::parse_error_code(psched::to_string(psched::ErrorCode::stale_step), code));
  CHECK(code == psched::ErrorCode::stale_step);
  CHECK_FALSE(psched::parse_error_code("nonsense", code));
}
