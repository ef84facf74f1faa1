// SPDX-License-Identifier: Apache-2.0
#include "view/metrics.h"

#include <cmath>

#include <fmt/format.h>

namespace psched {
namespace {

std::string_view type_name(MetricType type) {
  switch (type) {
    case MetricType::counter:
      return "counter";
    case MetricType::gauge:
      return "gauge";
    case MetricType::histogram:
      return "histogram";
  }
  return "untyped";
}

// A label value with backslash, double quote and newline escaped.
std::string escape_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string_view("\\n") : std::string_view(&c, 1);
  }
  return out;
}

// HELP text with backslash and newline escaped.
std::string escape_help(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += '\\';
    out += c == '\n' ? std::string_view("\\n") : std::string_view(&c, 1);
  }
  return out;
}

std::string format_value(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  return fmt::format("{}", value);
}

}  // namespace

void PrometheusText::family(std::string_view name, MetricType type, std::string_view help) {
  text_ +=
      fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help), name, type_name(type));
}

void PrometheusText::single(std::string_view name, MetricType type, std::string_view help,
                            const MetricLabels& labels, double value) {
  family(name, type, help);
  sample(name, labels, value);
}

void PrometheusText::sample(std::string_view name, const MetricLabels& labels, double value) {
  text_ += name;
  for (size_t i = 0; i < labels.size(); ++i)
    text_ += fmt::format("{}{}=\"{}\"", i == 0 ? "{" : ",", labels[i].first,
                         escape_label(labels[i].second));
  text_ += fmt::format("{} {}\n", labels.empty() ? "" : "}", format_value(value));
}

void PrometheusText::histogram(std::string_view name, const MetricLabels& labels,
                               const Histogram& histogram) {
  std::vector<uint64_t> cumulative = histogram.cumulative_counts();
  std::span<const double> bounds = histogram.upper_bounds();
  std::string bucket = fmt::format("{}_bucket", name);
  for (size_t i = 0; i < cumulative.size(); ++i) {
    MetricLabels with_le = labels;
    double le = i < bounds.size() ? bounds[i] : INFINITY;
    with_le.emplace_back("le", format_value(le));
    sample(bucket, with_le, static_cast<double>(cumulative[i]));
  }
  sample(fmt::format("{}_sum", name), labels, histogram.sum());
  sample(fmt::format("{}_count", name), labels, static_cast<double>(histogram.count()));
}

}  // namespace psched
