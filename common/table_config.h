// SPDX-License-Identifier: Apache-2.0
// TableConfig: an embedding table's entry in the deployment's `tables:` section, what every
// shard applies when a worker registers the table of that name (actors/shard/row_table.h,
// RowTable::declare): its capacity, what the registration must agree with, and how its steps
// wait.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/policies.h"

namespace psched {

struct TableConfig {
  std::string name;
  // The capacity a registration that gives none takes (TableSpec::max_rows, admit_after).
  uint64_t max_rows = 0;
  uint32_t admit_after = 0;
  // Checked against the registration when given; a registration that differs is refused
  // naming the field and both values.
  std::optional<uint32_t> dim;
  std::optional<std::string> optimizer;  // a row optimizer's name (sgd, adagrad, ...)
  // init: its kind ("zeros", "uniform", "normal") and, but for zeros, its two numbers.
  std::optional<std::string> init;
  std::vector<double> init_values;
  // How the table's steps wait (`mode:`, `staleness:`); none: table_mode:, else the job's.
  std::optional<StepRule> rule;
  bool operator==(const TableConfig&) const = default;
};

}  // namespace psched
