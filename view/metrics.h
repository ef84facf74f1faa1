// SPDX-License-Identifier: Apache-2.0
// PrometheusText: writes metrics in the Prometheus text exposition format (version 0.0.4),
// the body of a GET /metrics.
//
//   PrometheusText out;
//   out.family("psched_shard_received_bytes_total", MetricType::counter, "Gradient bytes ...");
//   out.sample("psched_shard_received_bytes_total", {{"shard", "0"}}, 4096);
//   std::string body = out.text();
//
// Each family is written once, HELP and TYPE first, then its samples. Names follow Prometheus
// practice: base units in the name (_seconds, _bytes), counters end in _total.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/histogram.h"

namespace psched {

enum class MetricType { counter, gauge, histogram };

// Label name and value pairs; values are escaped when written.
using MetricLabels = std::vector<std::pair<std::string_view, std::string>>;

// The Content-Type of the text format.
inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4";

class PrometheusText {
 public:
  // Starts a family: its # HELP and # TYPE lines.
  void family(std::string_view name, MetricType type, std::string_view help);
  // A family with one sample: its HELP and TYPE lines, then the sample.
  void single(std::string_view name, MetricType type, std::string_view help,
              const MetricLabels& labels, double value);
  // One sample line `name{labels} value`.
  void sample(std::string_view name, const MetricLabels& labels, double value);
  // A histogram family's samples: cumulative `name_bucket{le=...}` up to +Inf, `name_sum`,
  // `name_count`.
  void histogram(std::string_view name, const MetricLabels& labels, const Histogram& histogram);

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

}  // namespace psched
