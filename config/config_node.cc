// SPDX-License-Identifier: Apache-2.0
#include "config/config_node.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "config/byte_size.h"

namespace psched::config {
namespace {

// 1-based line of a mark, or 0 when yaml-cpp gave the node no position.
int line_of(const YAML::Mark& mark) {
  return mark.is_null() || mark.line < 0 ? 0 : mark.line + 1;
}

std::string_view kind_name(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return "nothing";
}

// The node's text; throws unless it is a single (scalar) value. `expected` completes
// "expected ..." in the message.
const std::string& scalar_text(const ConfigNode& node, std::string_view expected) {
  if (node.is_null()) node.fail(fmt::format("missing value (expected {})", expected));
  if (!node.yaml().IsScalar()) {
    node.fail(fmt::format("expected {}, got {}", expected, kind_name(node.yaml())));
  }
  return node.yaml().Scalar();
}

}  // namespace

ConfigNode::ConfigNode(const YAML::Node& node, std::string path, YAML::Mark key_mark,
                       const std::string& file)
    : node_(node), path_(std::move(path)), key_mark_(key_mark), file_(&file) {}

int ConfigNode::line() const {
  int value_line = is_null() ? 0 : line_of(node_.Mark());
  return value_line != 0 ? value_line : key_line();
}

int ConfigNode::key_line() const {
  int line = line_of(key_mark_);
  if (line == 0 && node_.IsDefined()) line = line_of(node_.Mark());
  return line != 0 ? line : 1;
}

std::string ConfigNode::child_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void ConfigNode::fail(std::string_view what) const {
  fail_at(line(), what);
}

void ConfigNode::fail_at(int line, std::string_view what) const {
  if (path_.empty()) psched::fail(ErrorCode::bad_config, "{}:{}: {}", *file_, line, what);
  psched::fail(ErrorCode::bad_config, "{}:{}: {}: {}", *file_, line, path_, what);
}

void ConfigNode::fail_child(std::string_view key, int line, std::string_view what) const {
  psched::fail(ErrorCode::bad_config, "{}:{}: {}: {}", *file_, line, child_path(key), what);
}

ConfigMap::ConfigMap(const ConfigNode& node, std::span<const std::string_view> allowed,
                     std::span<const RetiredKey> retired)
    : node_(node) {
  if (node.is_null()) return;
  std::string expected = fmt::format("{}", fmt::join(allowed, ", "));
  if (!node.yaml().IsMap()) {
    node.fail(fmt::format("expected a map with keys from: {}; got {}", expected,
                          node.yaml().IsSequence() ? "a list" : "a single value"));
  }
  for (auto it = node.yaml().begin(); it != node.yaml().end(); ++it) {
    const YAML::Node key = it->first;  // the iterator's pair is a temporary
    int line = line_of(key.Mark());
    if (!key.IsScalar()) node.fail_at(line, "expected only plain keys (" + expected + ")");
    const std::string& name = key.Scalar();
    auto gone = std::find_if(retired.begin(), retired.end(),
                             [&name](const RetiredKey& r) { return r.name == name; });
    if (gone != retired.end()) node.fail_child(name, line, fmt::format("removed: {}", gone->why));
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      node.fail_child(name, line, fmt::format("unknown key (expected one of: {})", expected));
    }
    if (std::optional<ConfigNode> first = find(name)) {
      node.fail_child(name, line,
                      fmt::format("duplicate key (first at line {})", first->key_line()));
    }
    entries_.emplace_back(name,
                          ConfigNode(it->second, node.child_path(name), key.Mark(), node.file()));
  }
}

std::optional<ConfigNode> ConfigMap::find(std::string_view key) const {
  for (const auto& [name, value] : entries_) {
    if (name == key) return value;
  }
  return std::nullopt;
}

ConfigNode ConfigMap::find_or_null(std::string_view key) const {
  if (std::optional<ConfigNode> found = find(key)) return *found;
  YAML::Mark at_map;
  at_map.line = node_.line() - 1;  // Mark lines are 0-based
  return ConfigNode(YAML::Node(), node_.child_path(key), at_map, node_.file());
}

ConfigNode ConfigMap::require(std::string_view key, std::string_view expected) const {
  std::optional<ConfigNode> found = find(key);
  if (!found) node_.fail_child(key, node_.line(), fmt::format("missing (expected {})", expected));
  return *found;
}

std::string read_string(const ConfigNode& node) {
  return scalar_text(node, "a string");
}

ConfigFile read_file_path(const ConfigNode& node, const std::filesystem::path& base_dir) {
  std::filesystem::path path = read_string(node);
  if (path.empty()) node.fail("is empty (expected a file name)");
  return {.path = path.is_relative() ? base_dir / path : path,
          .origin = fmt::format("{}:{}: {}", node.file(), node.line(), node.path())};
}

bool read_bool(const ConfigNode& node) {
  const std::string& text = scalar_text(node, "true or false");
  bool value = false;
  if (!YAML::convert<bool>::decode(node.yaml(), value)) {
    node.fail(fmt::format("'{}' is not true or false", text));
  }
  return value;
}

double read_number(const ConfigNode& node) {
  const std::string& text = scalar_text(node, "a number");
  double value = 0;
  const char* end = text.data() + text.size();
  auto [rest, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || rest != end || text.empty() || !std::isfinite(value)) {
    node.fail(fmt::format("'{}' is not a finite number", text));
  }
  return value;
}

uint64_t read_integer(const ConfigNode& node, uint64_t min, uint64_t max) {
  const std::string& text = scalar_text(node, "an integer");
  std::string_view digits = text;
  bool negative = digits.starts_with('-');
  if (negative) digits.remove_prefix(1);
  uint64_t value = 0;
  const char* end = digits.data() + digits.size();
  auto [rest, ec] = std::from_chars(digits.data(), end, value);
  bool too_large = ec == std::errc::result_out_of_range;
  if ((ec != std::errc() && !too_large) || rest != end) {
    node.fail(fmt::format("'{}' is not an integer", text));
  }
  if (too_large) value = UINT64_MAX;
  if (negative && value != 0) node.fail(fmt::format("must be at least {}, got {}", min, text));
  if (value < min) node.fail(fmt::format("must be at least {}, got {}", min, text));
  if (value > max) node.fail(fmt::format("must be at most {}, got {}", max, text));
  return value;
}

uint64_t read_byte_size(const ConfigNode& node, uint64_t min) {
  const std::string& text = scalar_text(node, "a byte size");
  std::optional<uint64_t> bytes = parse_byte_size(text);
  if (!bytes) {
    node.fail(
        fmt::format("'{}' is not a byte size (expected a whole number of bytes, optionally "
                    "with a unit: 4194304, 512KiB, 4MiB, 1GiB, 100B, 2MB)",
                    text));
  }
  if (*bytes < min) node.fail(fmt::format("must be at least {}, got {}", min, text));
  return *bytes;
}

size_t read_choice_index(const ConfigNode& node, std::span<const std::string_view> names) {
  std::string expected = fmt::format("one of: {}", fmt::join(names, ", "));
  const std::string& text = scalar_text(node, expected);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return i;
  }
  node.fail(fmt::format("'{}' is not {}", text, expected));
}

}  // namespace psched::config
