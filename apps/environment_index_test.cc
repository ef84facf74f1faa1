// SPDX-License-Identifier: Apache-2.0
#include "apps/environment_index.h"

#include <cstdlib>

#include <doctest/doctest.h>

#include "common/error.h"

using psched::parse_environment_index;

TEST_CASE("an index is a number or the ordinal at the end of a pod's name") {
  CHECK(parse_environment_index("SLURM_PROCID", "0") == 0);
  CHECK(parse_environment_index("SLURM_PROCID", "17") == 17);
  CHECK(parse_environment_index("POD_NAME", "psched-shard-3") == 3);
  CHECK(parse_environment_index("POD_NAME", "web-12") == 12);
}

TEST_CASE("a value holding no index is refused, naming the variable and the value") {
  for (const char* value :
       {"", "abc", "-1", "psched-shard-", "psched-shard-x", "3x", "1.5", "99999999999"}) {
    CAPTURE(value);
    try {
      parse_environment_index("SLURM_PROCID", value);
      FAIL("accepted");
    } catch (const psched::Error& e) {
      CHECK(e.code() == psched::ErrorCode::bad_config);
      CHECK(std::string(e.what()).starts_with(
          fmt::format("SLURM_PROCID=\"{}\" holds no index", value)));
    }
  }
}

TEST_CASE("an unset variable is refused, naming the variable looked for") {
  unsetenv("PSCHED_TEST_UNSET_INDEX");
  CHECK(psched::optional_environment_index("PSCHED_TEST_UNSET_INDEX") == std::nullopt);
  CHECK_THROWS_WITH(
      psched::environment_index("PSCHED_TEST_UNSET_INDEX", "no shard index"),
      doctest::Contains("no shard index: the environment has no PSCHED_TEST_UNSET_INDEX"));
  setenv("PSCHED_TEST_SET_INDEX", "psched-shard-1", 1);
  CHECK(psched::environment_index("PSCHED_TEST_SET_INDEX", "no shard index") == 1);
}
