// SPDX-License-Identifier: Apache-2.0
// NpyFile (actors/durability/npy_file.h): headers byte for byte as numpy 1.24's np.save writes
// them, a stream that must add up to its shape. numpy itself reads the files in
// python/tests/test_export.py.
#include "actors/durability/npy_file.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "actors/durability/file_io.h"
#include "actors/durability/temp_dir.h"
#include "common/error.h"

using namespace psched;

TEST_CASE("a header is numpy's dictionary, padded to a multiple of 64 bytes") {
  const std::string two = NpyFile::header("<f4", {2, 3});
  CHECK(two.size() == 128);  // 10 + 59 of dictionary + '\n' rounded up
  CHECK(two.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(static_cast<unsigned char>(two[8]) == 118);  // 128 - 10
  CHECK(two[9] == 0);
  CHECK(two.substr(10, 59) == "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  CHECK(two.back() == '\n');
  CHECK(NpyFile::header("<u8", {7}).find("'shape': (7,), }") != std::string::npos);
  CHECK(NpyFile::header("<f8", {}).find("'shape': (), }") != std::string::npos);
  const std::string long_shape = NpyFile::header("<f8", {1ull << 40, 1ull << 40, 1ull << 40});
  CHECK(long_shape.size() % 64 == 0);
}

TEST_CASE("a file holds its header then the elements written, and must add up to its shape") {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const std::vector<double> values{1.5, -2, 3.25, 4};
  const auto bytes = std::as_bytes(std::span(values));
  {
    NpyFile file(dir.path / "a.npy", "<f8", {2, 2}, 8);
    file.write(bytes.first(8));
    file.write(bytes.subspan(8));
    file.finish();
  }
  const std::vector<std::byte> read = read_file(dir.path / "a.npy");
  REQUIRE(read.size() == 128 + 32);
  CHECK(std::equal(read.begin() + 128, read.end(), bytes.begin()));

  NpyFile short_file(dir.path / "b.npy", "<f8", {3}, 8);
  short_file.write(bytes.first(16));
  CHECK_THROWS_WITH_AS(short_file.finish(),
                       doctest::Contains("16 bytes of data written where its shape holds 24"),
                       Error);
  CHECK_THROWS_WITH_AS(short_file.write(bytes), doctest::Contains("would go past"), Error);
}
