// SPDX-License-Identifier: Apache-2.0
// TempDir: a fresh directory for one test, removed with everything in it when the test ends.
#pragma once

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

namespace psched::testing {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           fmt::format("psched-store-{}-{}", ::getpid(), counter()++);
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
};

}  // namespace psched::testing
