// SPDX-License-Identifier: Apache-2.0
// docs/configuration.md against the loader, so the page cannot drift: its key tables name
// exactly the keys deployment_keys() gives, and every default it writes as a value (a default
// cell that starts with a backticked value) is what the loader takes when the key is left out.
#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "config/deployment.h"

namespace psched {
namespace {

constexpr std::string_view kKeyTableHeader = "| key | default | accepts | read by | what it does |";
const std::string kShard = "127.0.0.1:7000";

struct Row {
  std::string key;
  std::string default_cell;
};

std::string trimmed(std::string_view text) {
  size_t begin = text.find_first_not_of(' ');
  size_t end = text.find_last_not_of(' ');
  return begin == text.npos ? "" : std::string(text.substr(begin, end - begin + 1));
}

// The first backticked word of `cell`: "`scheduler.policy`" -> "scheduler.policy".
std::string backticked(const std::string& cell) {
  size_t open = cell.find('`');
  size_t close = cell.find('`', open + 1);
  return open == cell.npos || close == cell.npos ? "" : cell.substr(open + 1, close - open - 1);
}

// The rows of every key table of the page.
std::vector<Row> documented_rows() {
  std::ifstream page(std::string(PSCHED_SOURCE_DIR) + "/docs/configuration.md");
  REQUIRE(page);
  std::vector<Row> rows;
  bool in_key_table = false;
  for (std::string line; std::getline(page, line);) {
    if (line == kKeyTableHeader) {
      in_key_table = true;
      continue;
    }
    if (!line.starts_with("|")) in_key_table = false;
    if (!in_key_table || line.starts_with("|---")) continue;
    std::vector<std::string> cells;
    for (size_t at = 1, next; (next = line.find('|', at)) != line.npos; at = next + 1)
      cells.push_back(trimmed(std::string_view(line).substr(at, next - at)));
    REQUIRE_MESSAGE(cells.size() == 5, line);
    rows.push_back({backticked(cells[0]), cells[1]});
  }
  return rows;
}

// A deployment with one shard and the key `key` set to `value` ("" : left out), with what the
// key needs beside it (checkpoint.directory for the checkpoint section, mode: bounded for
// staleness and, with table_mode.mode: bounded, for table_mode.staleness).
std::string deployment_setting(const std::string& key, const std::string& value) {
  std::string top = key.substr(0, key.find('.'));
  std::string inner = key.find('.') == key.npos ? "" : key.substr(key.find('.') + 1);
  const bool bounded = key == "staleness" || key == "table_mode.staleness";
  std::string text = bounded ? "mode: bounded\n" : "";
  if (top == "shards[]") {
    text += "shards:\n  - {listen: " + kShard;
    if (!value.empty()) text += ", " + inner + ": " + value;
    return text + "}\n";
  }
  text += "shards:\n  - listen: " + kShard + "\n";
  std::string beside = top == "checkpoint"             ? "directory: state"
                       : key == "table_mode.staleness" ? "mode: bounded"
                                                       : "";
  if (inner.empty()) return value.empty() ? text : text + top + ": " + value + "\n";
  std::string fields = beside;
  if (!value.empty()) fields += (fields.empty() ? "" : ", ") + inner + ": " + value;
  return text + top + ": {" + fields + "}\n";
}

TEST_CASE("docs/configuration.md names every key the loader knows, with its default") {
  std::vector<Row> rows = documented_rows();
  std::set<std::string> documented;
  for (const Row& row : rows) CHECK_MESSAGE(documented.insert(row.key).second, row.key);
  std::vector<std::string> loader = deployment_keys();
  std::set<std::string> known(loader.begin(), loader.end());
  for (const std::string& key : known)
    CHECK_MESSAGE(documented.contains(key), key << " is not in docs/configuration.md");
  for (const std::string& key : documented)
    CHECK_MESSAGE(known.contains(key), key << " is documented but the loader does not know it");

  size_t checked = 0;
  for (const Row& row : rows) {
    if (!row.default_cell.starts_with('`')) continue;  // "required", "none", a rule in words
    std::string value = backticked(row.default_cell);
    INFO(row.key << ": documented default " << value);
    DeploymentConfig set = parse_deployment(deployment_setting(row.key, value), "configs/x.yaml");
    DeploymentConfig left_out = parse_deployment(deployment_setting(row.key, ""), "configs/x.yaml");
    CHECK(set == left_out);
    ++checked;
  }
  // Most defaults are values: a page whose cells stopped starting with one would check nothing.
  CHECK(checked >= 40);
}

}  // namespace
}  // namespace psched
