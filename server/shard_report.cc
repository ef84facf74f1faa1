// SPDX-License-Identifier: Apache-2.0
#include "server/shard_report.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "common/slot_map.h"
#include "view/metrics.h"

namespace psched {
namespace {

using nlohmann::json;

json histogram_json(const Histogram& histogram) {
  json buckets = json::array();
  std::vector<uint64_t> cumulative = histogram.cumulative_counts();
  for (size_t i = 0; i < histogram.upper_bounds().size(); ++i)
    buckets.push_back({histogram.upper_bounds()[i], cumulative[i]});
  return {{"count", histogram.count()}, {"sum", histogram.sum()}, {"buckets", buckets}};
}

json errors_json(const ShardStats& stats) {
  json by_code = json::object();
  for (size_t i = 0; i < kErrorCodeCount; ++i)
    if (stats.errors[i] != 0)
      by_code[std::string(to_string(static_cast<ErrorCode>(i)))] = stats.errors[i];
  return by_code;
}

json recent_errors_json(const ShardStats& stats) {
  json recent = json::array();
  for (const RecentError& e : stats.recent_errors)
    recent.push_back(
        {{"time", fmt::format("{:%FT%TZ}", std::chrono::floor<std::chrono::seconds>(e.time))},
         {"code", to_string(e.code)},
         {"message", e.message}});
  return recent;
}

json config_json(const DeploymentConfig& config) {
  json shards = json::array();
  for (const ShardConfig& s : config.shards)
    shards.push_back({{"listen", s.listen.to_string()}, {"http", s.http.to_string()}});
  return {{"file", config.source.string()},
          {"mode", to_string(config.mode)},
          {"workers", config.workers},
          {"auth", !config.auth_token.empty()},
          {"split_bytes", config.split_bytes},
          {"optimizer", optim::to_string(config.optimizer.kind)},
          {"shards", shards}};
}

}  // namespace

namespace {

// Bytes in and out, and what became of the pushes.
void traffic_metrics(PrometheusText& out, const ShardStats& s, const MetricLabels& shard) {
  out.single("psched_shard_received_bytes_total", MetricType::counter,
             "Gradient payload bytes the shard accepted.", shard, double(s.bytes_received));
  out.single("psched_shard_sent_bytes_total", MetricType::counter,
             "Parameter value bytes the shard answered to polls and pulls.", shard,
             double(s.bytes_sent));
  out.family("psched_shard_wire_bytes_total", MetricType::counter,
             "Payload bytes of accepted pushes (in) and of values (out), as the variable's dtype "
             "carries them (raw) and as they travelled (sent; less when compressed).");
  for (const auto& [direction, bytes] : {std::pair{"push", s.push_wire}, {"pull", s.pull_wire}}) {
    for (const auto& [form, value] : {std::pair{"raw", bytes.raw}, {"sent", bytes.sent}}) {
      MetricLabels labels = shard;
      labels.emplace_back("direction", direction);
      labels.emplace_back("form", form);
      out.sample("psched_shard_wire_bytes_total", labels, double(value));
    }
  }
  out.family("psched_shard_delta_pulls_total", MetricType::counter,
             "Delta polls (compression pull: topk) answered with a delta, and with full values "
             "(the worker held no version the shard could answer from).");
  for (const auto& [answer, value] :
       {std::pair{"delta", s.delta_pulls.deltas}, {"full", s.delta_pulls.full}}) {
    MetricLabels labels = shard;
    labels.emplace_back("answer", answer);
    out.sample("psched_shard_delta_pulls_total", labels, double(value));
  }
  out.single("psched_shard_deltas_published_total", MetricType::counter,
             "Deltas the shard published (one a partition a changed version).", shard,
             double(s.delta_pulls.published));
  out.single("psched_shard_delta_copy_bytes", MetricType::gauge,
             "Bytes the published copies and rings of delta pulls hold.", shard,
             double(s.delta_pulls.held_bytes));
  out.single("psched_shard_partitions_applied_total", MetricType::counter,
             "Partition updates the shard applied.", shard, double(s.partitions_applied));
  out.single("psched_shard_duplicate_pushes_total", MetricType::counter,
             "Resent pushes the shard had already applied: acknowledged, not applied again.", shard,
             double(s.pushes_duplicate));
  out.single("psched_shard_checkpoints_total", MetricType::counter, "Checkpoints the shard wrote.",
             shard, double(s.checkpoints_written));
}

// What the step machine keeps: timeouts, members, joins and leaves, each member's lag.
void step_metrics(PrometheusText& out, const ShardStats& s, const MetricLabels& shard) {
  out.single("psched_shard_sync_timeouts_total", MetricType::counter,
             "Waits for members behind that passed sync.timeout_seconds: sync steps, bounded "
             "mode's held polls.",
             shard, double(s.sync_timeouts));
  out.single("psched_shard_late_pushes_total", MetricType::counter,
             "Pushes of a sync step applied without their worker: acknowledged, dropped.", shard,
             double(s.pushes_late));
  out.single("psched_shard_members", MetricType::gauge,
             "Sync and bounded modes: workers that are members of the job now (steps wait for "
             "them).",
             shard, double(s.members));
  out.single("psched_shard_held_polls_total", MetricType::counter,
             "Polls held: bounded mode's until every member pushed the step staleness behind, "
             "sync mode's until the step before their own closed.",
             shard, double(s.polls_held));
  out.single("psched_shard_held_pushes_total", MetricType::counter,
             "Sync mode: pushes of the step after the one under way, held until it closed.", shard,
             double(s.pushes_held));
  out.single("psched_shard_joins_total", MetricType::counter,
             "Sync and bounded modes: workers that joined or rejoined the job.", shard,
             double(s.joins));
  out.single("psched_shard_leaves_total", MetricType::counter,
             "Sync and bounded modes: workers that left the job (their lease ended).", shard,
             double(s.leaves));
  out.single("psched_shard_short_handed_ranges_total", MetricType::counter,
             "Sync mode: element ranges of a step applied from fewer gradients than the job has "
             "workers.",
             shard, double(s.short_handed_ranges));
  if (s.workers.empty()) return;
  out.family("psched_shard_worker_lag_steps", MetricType::gauge,
             "Sync and bounded modes: steps between the newest step any worker pushed here and "
             "each member's newest.");
  for (const MemberStatus& m : s.workers) {
    if (!m.member) continue;
    MetricLabels labels = shard;
    labels.emplace_back("worker", std::to_string(m.worker));
    out.sample("psched_shard_worker_lag_steps", labels, double(m.lag_steps));
  }
}

// How long applies and polls take, what waits, and the requests failed by code.
void load_metrics(PrometheusText& out, const ShardSnapshot& snapshot, const MetricLabels& shard) {
  const ShardStats& s = snapshot.stats;
  out.family("psched_shard_apply_seconds", MetricType::histogram,
             "Time to validate and apply (sync: sum) one accepted push.");
  out.histogram("psched_shard_apply_seconds", shard, s.apply_seconds);
  out.family("psched_shard_poll_wait_seconds", MetricType::histogram,
             "Time from a poll's arrival to its answer.");
  out.histogram("psched_shard_poll_wait_seconds", shard, s.poll_wait_seconds);
  out.single("psched_shard_waiting_polls", MetricType::gauge,
             "Polls waiting for an update to be applied.", shard, double(s.polls_waiting));
  out.single("psched_shard_variables", MetricType::gauge, "Variable parts the shard holds.", shard,
             double(s.variables));
  out.single("psched_shard_connected_workers", MetricType::gauge,
             "Open RPC connections (one per connected worker).", shard,
             double(snapshot.connections));
  out.family("psched_shard_errors_total", MetricType::counter,
             "Requests the shard failed, by error code.");
  for (size_t i = 0; i < kErrorCodeCount; ++i) {
    MetricLabels labels = shard;
    labels.emplace_back("code", std::string(to_string(static_cast<ErrorCode>(i))));
    out.sample("psched_shard_errors_total", labels, double(s.errors[i]));
  }
}

}  // namespace

namespace {

// The shard's tables together: their rows and bytes.
TableStats tables_total(const ShardStats& s) {
  TableStats total;
  for (const TableStats& t : s.table_stats) {
    total.rows += t.rows;
    total.bytes += t.bytes;
    total.payload_bytes += t.payload_bytes;
  }
  return total;
}

// Each embedding table's share of the shard (none: no family at all).
void table_metrics(PrometheusText& out, const ShardStats& s, const MetricLabels& shard) {
  if (s.table_stats.empty()) return;
  struct Figure {
    const char* name;
    MetricType type;
    const char* help;
    uint64_t TableStats::*field;
  };
  static constexpr Figure kFigures[] = {
      {"psched_shard_table_rows", MetricType::gauge, "Rows of each table the shard stores.",
       &TableStats::rows},
      {"psched_shard_table_bytes", MetricType::gauge,
       "Bytes each table holds on the shard (rows, optimizer state, index).", &TableStats::bytes},
      {"psched_shard_table_payload_bytes", MetricType::gauge,
       "Of those, the rows' values and optimizer state.", &TableStats::payload_bytes},
      {"psched_shard_table_rows_created_total", MetricType::counter,
       "Rows stored at their first update (again after an eviction).", &TableStats::rows_created},
      {"psched_shard_table_rows_pushed_total", MetricType::counter,
       "Rows of accepted pushes (each worker's, each step).", &TableStats::rows_pushed},
      {"psched_shard_table_rows_pulled_total", MetricType::counter, "Rows answered to pulls.",
       &TableStats::rows_pulled},
      {"psched_shard_table_max_rows", MetricType::gauge,
       "Rows each table may store on the shard (max_rows; 0: no bound).", &TableStats::max_rows},
      {"psched_shard_table_rows_evicted_total", MetricType::counter,
       "Least recently updated rows evicted at max_rows.", &TableStats::rows_evicted},
      {"psched_shard_table_updates_dropped_total", MetricType::counter,
       "Row updates dropped before the row's admission (admit_after).",
       &TableStats::updates_dropped}};
  for (const Figure& figure : kFigures) {
    out.family(figure.name, figure.type, figure.help);
    for (const TableStats& table : s.table_stats) {
      MetricLabels labels = shard;
      labels.emplace_back("table", table.name);
      out.sample(figure.name, labels, double(table.*figure.field));
    }
  }
}

// All of the shard's tables together, against limits.max_table_bytes.
void tables_total_metrics(PrometheusText& out, const ShardStats& s, const MetricLabels& shard) {
  if (s.table_stats.empty()) return;
  const TableStats total = tables_total(s);
  out.single("psched_shard_tables_bytes", MetricType::gauge,
             "Bytes all tables hold on the shard, against limits.max_table_bytes.", shard,
             double(total.bytes));
  out.single("psched_shard_tables_payload_bytes", MetricType::gauge,
             "Of those, the rows' values and optimizer state.", shard, double(total.payload_bytes));
  out.single("psched_shard_tables_bytes_limit", MetricType::gauge,
             "limits.max_table_bytes (0: no limit).", shard, double(s.table_bytes_limit));
}

json tables_json(const ShardStats& s) {
  json tables = json::array();
  for (const TableStats& t : s.table_stats)
    tables.push_back({{"name", t.name},
                      {"rows", t.rows},
                      {"bytes", t.bytes},
                      {"payload_bytes", t.payload_bytes},
                      {"rows_created", t.rows_created},
                      {"rows_pushed", t.rows_pushed},
                      {"rows_pulled", t.rows_pulled},
                      {"max_rows", t.max_rows},
                      {"rows_evicted", t.rows_evicted},
                      {"updates_dropped", t.updates_dropped}});
  return tables;
}

}  // namespace

std::string shard_metrics_text(const ShardSnapshot& snapshot) {
  const MetricLabels shard = {{"shard", std::to_string(snapshot.id.value)}};
  PrometheusText out;
  traffic_metrics(out, snapshot.stats, shard);
  step_metrics(out, snapshot.stats, shard);
  load_metrics(out, snapshot, shard);
  table_metrics(out, snapshot.stats, shard);
  tables_total_metrics(out, snapshot.stats, shard);
  out.single("psched_shard_slots", MetricType::gauge,
             "Hash slots of the job's slot map this shard owns (common/slot_map.h).", shard,
             snapshot.stats.slots_owned);
  out.single("psched_shard_slot_map_epoch", MetricType::gauge,
             "Epoch of the job's slot map: 1 at the job's start, one more at each reshard.", shard,
             snapshot.stats.slot_epoch);
  if (const auto& served = snapshot.stats.served) {
    out.single("psched_shard_served_generation", MetricType::gauge,
               "Generation of the job's checkpoint a serving shard serves (psched-server --serve).",
               shard, served->generation);
    out.single("psched_shard_served_step", MetricType::gauge,
               "Newest step complete in the version a serving shard serves.", shard, served->step);
    out.single("psched_shard_versions_loaded_total", MetricType::counter,
               "Versions a serving shard loaded, its first included.", shard,
               snapshot.stats.versions_loaded);
    out.single("psched_shard_reloads_refused_total", MetricType::counter,
               "Newer versions a serving shard refused, serving the one it had.", shard,
               snapshot.stats.reloads_refused);
  }
  out.single("psched_process_uptime_seconds", MetricType::gauge,
             "Seconds since the server process started.", {}, snapshot.uptime_seconds);
  return out.text();
}

// Sync mode's members, joins and leaves; null in async mode.
json membership_json(const ShardStats& s) {
  if (s.workers.empty()) return nullptr;
  json workers = json::array();
  for (const MemberStatus& m : s.workers)
    workers.push_back({{"worker", m.worker},
                       {"member", m.member},
                       {"joined_at", m.joined_at.value},
                       {"connections", m.connections},
                       {"pushed_step", m.pushed.value},
                       {"lag_steps", m.lag_steps}});
  return {{"members", s.members},       {"joins", s.joins},
          {"leaves", s.leaves},         {"short_handed_ranges", s.short_handed_ranges},
          {"polls_held", s.polls_held}, {"pushes_held", s.pushes_held},
          {"workers", workers}};
}

// The job and its slot map as this shard holds them (common/slot_map.h).
json placement_json(const ShardStats& s) {
  return {{"job", fmt::format("{:016x}", s.job)},
          {"slot_map_epoch", s.slot_epoch},
          {"shards", s.slot_shards},
          {"slots", s.slots_owned},
          {"slots_total", SlotMap::kSlots}};
}

// A serving shard's version (VariableShard::serve); null for a shard that trains.
json serving_json(const ShardStats& s) {
  if (!s.served) return nullptr;
  const ServedVersion& v = *s.served;
  return {{"checkpoint", v.checkpoint.string()},
          {"generation", v.generation},
          {"step", v.step},
          {"written_at_ns", v.written_at_ns},
          {"loaded_at_ns", v.loaded_at_ns},
          {"versions_loaded", s.versions_loaded},
          {"reloads_refused", s.reloads_refused}};
}

// Payload bytes both ways, as their dtype carries them and as they were sent.
json wire_bytes_json(const ShardStats& s) {
  return {{"push", {{"raw", s.push_wire.raw}, {"sent", s.push_wire.sent}}},
          {"pull", {{"raw", s.pull_wire.raw}, {"sent", s.pull_wire.sent}}}};
}

json delta_pulls_json(const ShardStats& s) {
  return {{"deltas", s.delta_pulls.deltas},
          {"full", s.delta_pulls.full},
          {"published", s.delta_pulls.published},
          {"held_bytes", s.delta_pulls.held_bytes}};
}

json shard_status_json(const ShardSnapshot& snapshot, const DeploymentConfig& config) {
  const ShardStats& s = snapshot.stats;
  json variables = json::array();
  for (const VariableStatus& v : snapshot.variables)
    variables.push_back(
        {{"name", v.name}, {"begin", v.part.begin}, {"end", v.part.end}, {"step", v.step.value}});
  return {{"shard", snapshot.id.value},
          {"uptime_seconds", snapshot.uptime_seconds},
          {"placement", placement_json(s)},
          {"serving", serving_json(s)},
          {"config", config_json(config)},
          {"connected_workers", snapshot.connections},
          {"variables", s.variables},
          {"tables", tables_json(s)},
          {"tables_bytes",
           {{"held", tables_total(s).bytes},
            {"payload", tables_total(s).payload_bytes},
            {"limit", s.table_bytes_limit}}},
          {"bytes_received", s.bytes_received},
          {"bytes_sent", s.bytes_sent},
          {"wire_bytes", wire_bytes_json(s)},
          {"delta_pulls", delta_pulls_json(s)},
          {"partitions_applied", s.partitions_applied},
          {"pushes_rejected", s.pushes_rejected},
          {"pushes_duplicate", s.pushes_duplicate},
          {"checkpoints_written", s.checkpoints_written},
          {"sync_timeouts", s.sync_timeouts},
          {"pushes_late", s.pushes_late},
          {"polls_waiting", s.polls_waiting},
          {"apply_seconds", histogram_json(s.apply_seconds)},
          {"poll_wait_seconds", histogram_json(s.poll_wait_seconds)},
          {"errors", errors_json(s)},
          {"recent_errors", recent_errors_json(s)},
          {"membership", membership_json(s)},
          {"variable_steps", variables}};
}

json short_handed_json(const std::vector<ShortHanded>& records) {
  json out = json::array();
  for (const ShortHanded& r : records)
    out.push_back({{"variable", r.variable},
                   {"step", r.step.value},
                   {"begin", r.range.begin},
                   {"end", r.range.end},
                   {"workers", r.workers}});
  return out;
}

}  // namespace psched
