// SPDX-License-Identifier: Apache-2.0
// A file that a deployment names (auth.token_file, tls.cert_file, ...): where it is, and where
// the YAML names it, so that whoever reads it later fails with a message pointing at the YAML.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace psched {

struct ConfigFile {
  std::filesystem::path path;  // resolved against the YAML file's folder
  std::string origin;          // "configs/x.yaml:12: tls.ca_file"
  bool operator==(const ConfigFile&) const = default;
};

// The file's whole content. Throws Error(bad_config) "<origin>: cannot open '<path>': <reason>"
// when it is missing, unreadable or a directory.
std::string read_config_file(const ConfigFile& file);
// Throws Error(bad_config) "<origin>: '<path>' <what>".
[[noreturn]] void fail_config_file(const ConfigFile& file, std::string_view what);
// Logs a warning when the file's group or others may read it (it holds a secret).
void warn_if_shared(const ConfigFile& file);

// A file's version as stat(2) tells it, to read a file again only when it changed: a file
// replaced whole (written, then renamed over it) is a new inode whatever the resolution of its
// modification time; one edited in place has a new size or modification time.
struct FileVersion {
  uint64_t device = 0, inode = 0;
  int64_t size = 0, seconds = 0, nanoseconds = 0;
  bool operator==(const FileVersion&) const = default;
};
// `file`'s version now. Throws Error(bad_config) naming the file when it cannot be stat'ed.
FileVersion file_version(const std::filesystem::path& file);

}  // namespace psched
