// SPDX-License-Identifier: Apache-2.0
// A file that a deployment names (auth.token_file, tls.cert_file, ...): where it is, and where
// the YAML names it, so that whoever reads it later fails with a message pointing at the YAML.
#pragma once

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

}  // namespace psched
