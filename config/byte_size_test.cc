// SPDX-License-Identifier: Apache-2.0
#include "config/byte_size.h"

#include <doctest/doctest.h>

namespace psched {
namespace {

TEST_CASE("byte sizes read plain numbers and binary and decimal units") {
  CHECK(parse_byte_size("4194304") == 4194304u);
  CHECK(parse_byte_size("0") == 0u);
  CHECK(parse_byte_size("100B") == 100u);
  CHECK(parse_byte_size("512KiB") == 512u * 1024);
  CHECK(parse_byte_size("4MiB") == 4u << 20);
  CHECK(parse_byte_size("4 MiB") == 4u << 20);
  CHECK(parse_byte_size("1GiB") == uint64_t{1} << 30);
  CHECK(parse_byte_size("2TiB") == uint64_t{2} << 40);
  CHECK(parse_byte_size("2MB") == 2000000u);
  CHECK(parse_byte_size("3kB") == 3000u);
  CHECK(parse_byte_size("3KB") == 3000u);
  CHECK(parse_byte_size("5GB") == 5000000000u);
}

TEST_CASE("byte sizes reject anything that is not a whole number of a known unit") {
  for (const char* text : {"", "MiB", "12 furlongs", "1.5MiB", "-1", "+1", " 1", "1 ", "1  MiB",
                           "4mib", "4Mi", "0x10", "18446744073709551616", "16777216TiB"}) {
    CAPTURE(text);
    CHECK_FALSE(parse_byte_size(text).has_value());
  }
  CHECK(parse_byte_size("18446744073709551615") == UINT64_MAX);
}

TEST_CASE("byte sizes format as the largest exact binary unit and read back") {
  CHECK(format_byte_size(0) == "0B");
  CHECK(format_byte_size(1000) == "1000B");
  CHECK(format_byte_size(1024) == "1KiB");
  CHECK(format_byte_size(64u << 20) == "64MiB");
  CHECK(format_byte_size(uint64_t{3} << 40) == "3TiB");
  for (uint64_t bytes : {uint64_t{0}, uint64_t{7}, uint64_t{1536}, uint64_t{1} << 50}) {
    CHECK(parse_byte_size(format_byte_size(bytes)) == bytes);
  }
}

}  // namespace
}  // namespace psched
