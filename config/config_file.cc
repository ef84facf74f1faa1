// SPDX-License-Identifier: Apache-2.0
#include "config/config_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error.h"
#include "common/log.h"

namespace psched {

std::string read_config_file(const ConfigFile& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file.path, ec)) fail_config_file(file, "is a directory");
  std::ifstream in(file.path, std::ios::binary);
  if (!in)
    fail(ErrorCode::bad_config, "{}: cannot open '{}': {}", file.origin, file.path.string(),
         std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail_config_file(file, "cannot be read");
  return text;
}

void fail_config_file(const ConfigFile& file, std::string_view what) {
  fail(ErrorCode::bad_config, "{}: '{}' {}", file.origin, file.path.string(), what);
}

void warn_if_shared(const ConfigFile& file) {
  using std::filesystem::perms;
  std::error_code ec;
  perms mode = std::filesystem::status(file.path, ec).permissions();
  if (ec || (mode & (perms::group_read | perms::others_read)) == perms::none) return;
  log_warn("{}: '{}' holds a secret but others may read it (expected chmod 600)", file.origin,
           file.path.string());
}

FileVersion file_version(const std::filesystem::path& file) {
  struct stat status {};
  if (::stat(file.c_str(), &status) != 0)
    fail(ErrorCode::bad_config, "{}: {}", file.string(), std::strerror(errno));
  return {static_cast<uint64_t>(status.st_dev), static_cast<uint64_t>(status.st_ino),
          status.st_size, status.st_mtim.tv_sec, status.st_mtim.tv_nsec};
}

}  // namespace psched
