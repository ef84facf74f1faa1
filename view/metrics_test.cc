// SPDX-License-Identifier: Apache-2.0
#include "view/metrics.h"

#include <doctest/doctest.h>

namespace psched {

TEST_CASE("a Prometheus family is its HELP and TYPE lines, then its samples") {
  PrometheusText out;
  out.family("psched_x_bytes_total", MetricType::counter, "Bytes.\nAll of them \\ here.");
  out.sample("psched_x_bytes_total", {{"shard", "0"}, {"path", "a\"b\\c\nd"}}, 4096);
  out.sample("psched_up", {}, 1.5);
  CHECK(out.text() ==
        "# HELP psched_x_bytes_total Bytes.\\nAll of them \\\\ here.\n"
        "# TYPE psched_x_bytes_total counter\n"
        "psched_x_bytes_total{shard=\"0\",path=\"a\\\"b\\\\c\\nd\"} 4096\n"
        "psched_up 1.5\n");
}

TEST_CASE("a histogram is written as cumulative buckets up to +Inf, then its sum and count") {
  static constexpr std::array<double, 2> kBounds = {0.25, 1};
  Histogram h(kBounds);
  h.observe(0.125);
  h.observe(0.5);
  h.observe(2);
  PrometheusText out;
  out.histogram("psched_apply_seconds", {{"shard", "1"}}, h);
  CHECK(out.text() ==
        "psched_apply_seconds_bucket{shard=\"1\",le=\"0.25\"} 1\n"
        "psched_apply_seconds_bucket{shard=\"1\",le=\"1\"} 2\n"
        "psched_apply_seconds_bucket{shard=\"1\",le=\"+Inf\"} 3\n"
        "psched_apply_seconds_sum{shard=\"1\"} 2.625\n"
        "psched_apply_seconds_count{shard=\"1\"} 3\n");
}

}  // namespace psched
