// SPDX-License-Identifier: Apache-2.0
// NpyFile (actors/durability/npy_file.h): headers byte for byte as numpy 1.24's np.save writes
// them, a stream that must add up to its shape; NpyReader reads them back, and what is no .npy
// file it can read is refused. numpy itself reads the files in
// python/tests/test_export.py.
#include "actors/durability/npy_file.h"

#include <fstream>
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

namespace {

// `header`'s dictionary as a .npy file of format `major`.0 (1: a 2-byte length, 2: 4 bytes),
// then `data`.
void write_npy(const std::filesystem::path& file, const std::string& dict, int major,
               const std::string& data) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const size_t length = dict.size();
  for (int k = 0; k < (major == 1 ? 2 : 4); ++k)
    out += static_cast<char>((length >> (8 * k)) & 0xff);
  std::ofstream(file, std::ios::binary) << out << dict << data;
}

std::string refusal(const std::filesystem::path& file) {
  try {
    NpyReader reader(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no refusal)";
}

}  // namespace

TEST_CASE("a reader takes back what NpyFile wrote, and numpy's version 2 headers") {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const std::vector<uint64_t> ids{3, 1, 4};
  {
    NpyFile file(dir.path / "ids.npy", "<u8", {3}, 8);
    file.write(std::as_bytes(std::span(ids)));
    file.finish();
  }
  NpyReader reader(dir.path / "ids.npy");
  CHECK(reader.descr() == "<u8");
  CHECK(reader.shape() == std::vector<uint64_t>{3});
  reader.expect("ids", {"<i8", "<u8"}, {3});
  std::vector<uint64_t> back(3);
  reader.read(std::as_writable_bytes(std::span(back)).first(8));
  reader.read(std::as_writable_bytes(std::span(back)).subspan(8));
  CHECK(back == ids);
  CHECK_THROWS_WITH_AS(reader.read(std::as_writable_bytes(std::span(back)).first(1)),
                       doctest::Contains("ends at byte 24 of its data, 1 more asked for"), Error);
  CHECK_THROWS_WITH_AS(reader.expect("table 't' ids", {"<i8"}, {3}),
                       doctest::Contains("is '<u8' of shape (3) where '<i8' of shape (3) is "
                                         "expected"),
                       Error);
  CHECK_THROWS_WITH_AS(reader.expect("table 't' ids", {"<u8"}, {4}),
                       doctest::Contains("of shape (3) where '<u8' of shape (4)"), Error);

  const double two[] = {0.5, 0.25};
  write_npy(dir.path / "v2.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }\n", 2,
            std::string(reinterpret_cast<const char*>(two), sizeof two));
  NpyReader wide(dir.path / "v2.npy");
  CHECK(wide.shape() == std::vector<uint64_t>{1, 2});
  wide.expect("v", {"<f8"}, {1, 2});
  double got[2];
  wide.read(std::as_writable_bytes(std::span(got)));
  CHECK(got[1] == 0.25);
}

TEST_CASE("a file that is no .npy, in Fortran order or shorter than its shape is refused") {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "x.npy";
  CHECK(refusal(file).find("x.npy: cannot be read") != std::string::npos);
  std::ofstream(file) << "not numpy at all";
  CHECK(refusal(file).ends_with("x.npy: not a .npy file (no \\x93NUMPY magic of version 1 to 3)"));
  write_npy(file, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n", 1,
            std::string(16, '\0'));
  CHECK(refusal(file).ends_with("x.npy: not in C order (fortran_order is not False)"));
  write_npy(file, "{'descr': '<f4', 'fortran_order': False, }\n", 1, "");
  CHECK(refusal(file).find("a header without descr or shape") != std::string::npos);
  write_npy(file, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n", 1,
            std::string(12, '\0'));
  NpyReader short_one(file);
  CHECK_THROWS_WITH_AS(short_one.expect("w", {"<f4"}, {2, 2}),
                       doctest::Contains("holds 12 bytes of data where its shape needs 16"), Error);
}

TEST_CASE("an array of no elements a row (an sgd table's optimizer state) is written and read") {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path);
  {
    NpyFile file(dir.path / "state.npy", "<f4", {5, 0}, 4);
    file.write({});  // a chunk of rows with no state: returns at once
    file.finish();
  }
  NpyReader reader(dir.path / "state.npy");
  reader.expect("state", {"<f4"}, {5, 0});
  reader.read({});
}
