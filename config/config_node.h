// SPDX-License-Identifier: Apache-2.0
// Reading typed values out of a parsed YAML tree, with messages that name the file, the line
// and the key path. Internal to config/: deployment.cc builds its sections from these.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/config_file.h"

namespace psched::config {

// A YAML node and what a message about it needs: the file name, the key path
// ("shards[1].listen"; empty for the document root) and the line of the key it sits under.
// Cheap to copy (YAML::Node is a handle); `file` is borrowed and must outlive every copy.
class ConfigNode {
 public:
  ConfigNode(const YAML::Node& node, std::string path, YAML::Mark key_mark,
             const std::string& file);
  ConfigNode(const ConfigNode&) = default;
  // YAML::Node's assignment writes through to the node it refers to; never assign.
  ConfigNode& operator=(const ConfigNode&) = delete;

  const YAML::Node& yaml() const { return node_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return *file_; }
  bool is_null() const { return !node_.IsDefined() || node_.IsNull(); }

  // 1-based line of the value; of its key when the value has no position of its own (an empty
  // value: yaml-cpp marks it at the next token); 1 when neither is known (an empty document).
  int line() const;
  // 1-based line of the key ("optimizer:"), for errors about a whole section.
  int key_line() const;

  // "shards" + "listen" -> "shards.listen"; "" + "mode" -> "mode".
  std::string child_path(std::string_view key) const;

  // Throw Error(bad_config, "<file>:<line>: <path>: <what>") at line() or at `line`.
  [[noreturn]] void fail(std::string_view what) const;
  [[noreturn]] void fail_at(int line, std::string_view what) const;
  // As fail_at, for a key under this node that has no node of its own (a missing key).
  [[noreturn]] void fail_child(std::string_view key, int line, std::string_view what) const;

 private:
  YAML::Node node_;
  std::string path_;
  YAML::Mark key_mark_;
  const std::string* file_;
};

// A key a section once had and no longer reads: a file that still sets it is refused, with
// `why` (why it went, and what to do instead) rather than as an unknown key.
struct RetiredKey {
  std::string_view name;
  std::string_view why;
};

// The entries of a YAML map, after checking that each key is allowed and appears once.
class ConfigMap {
 public:
  // A null node reads as an empty map (every key takes its default). Throws Error(bad_config)
  // when `node` is not a map, a key is not a string, a key repeats, a key is `retired` ("removed:
  // <why>", at the key's line) or a key is not in `allowed` (at the key's line, listing
  // `allowed`).
  ConfigMap(const ConfigNode& node, std::span<const std::string_view> allowed,
            std::span<const RetiredKey> retired = {});

  const ConfigNode& node() const { return node_; }
  std::optional<ConfigNode> find(std::string_view key) const;
  // As find; a missing key gives a null node at the map's line (readers treat it as absent).
  ConfigNode find_or_null(std::string_view key) const;
  // As find; a missing key throws "<path>.<key>: missing (expected <expected>)" at the map's line.
  ConfigNode require(std::string_view key, std::string_view expected) const;

 private:
  ConfigNode node_;
  std::vector<std::pair<std::string, ConfigNode>> entries_;
};

// Each reader throws Error(bad_config) at the node, saying what it expected, when the value is
// missing (null), not a single value, or does not parse.
std::string read_string(const ConfigNode& node);  // any scalar, taken as text
bool read_bool(const ConfigNode& node);           // true/false (and YAML's yes/no/on/off)
double read_number(const ConfigNode& node);       // finite decimal, "0.001", "1e-3"
uint64_t read_integer(const ConfigNode& node, uint64_t min, uint64_t max);  // decimal digits
uint64_t read_byte_size(const ConfigNode& node, uint64_t min);  // parse_byte_size, >= min
// A path, resolved against `base_dir` when relative; the file is not opened here.
ConfigFile read_file_path(const ConfigNode& node, const std::filesystem::path& base_dir);

// Index into `names` of the node's value; otherwise throws "'x' is not one of: a, b".
size_t read_choice_index(const ConfigNode& node, std::span<const std::string_view> names);

template <typename Enum, size_t N>
Enum read_choice(const ConfigNode& node,
                 const std::array<std::pair<std::string_view, Enum>, N>& choices) {
  std::array<std::string_view, N> names;
  for (size_t i = 0; i < N; ++i) names[i] = choices[i].first;
  return choices[read_choice_index(node, names)].second;
}

}  // namespace psched::config
