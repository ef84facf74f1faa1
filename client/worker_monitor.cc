// SPDX-License-Identifier: Apache-2.0
#include "client/worker_monitor.h"

#include "view/metrics.h"

namespace psched {

std::string worker_metrics_text(const WorkerStats& stats) {
  const SchedulerStats& s = stats.scheduler;
  const MetricLabels worker = {{"worker", std::to_string(stats.worker.value)}};
  PrometheusText out;
  out.single("psched_worker_credit_bytes", MetricType::gauge,
             "Each credit window (one a direction): bytes allowed in flight.", worker,
             double(s.credit_bytes));
  out.family("psched_worker_credit_in_use_bytes", MetricType::gauge,
             "Credit held now by tasks in flight, by direction (push: sent, not acknowledged; "
             "pull: answers not landed).");
  for (auto [direction, bytes] :
       {std::pair{"push", s.push_bytes_in_flight}, std::pair{"pull", s.pull_bytes_in_flight}}) {
    MetricLabels labels = worker;
    labels.emplace_back("direction", direction);
    out.sample("psched_worker_credit_in_use_bytes", labels, double(bytes));
  }
  out.family("psched_worker_queued_partitions", MetricType::gauge,
             "Partitions waiting for credit, by priority (lower goes first).");
  for (const auto& [priority, count] : s.queued_by_priority) {
    MetricLabels labels = worker;
    labels.emplace_back("priority", std::to_string(priority.value));
    out.sample("psched_worker_queued_partitions", labels, double(count));
  }
  out.single("psched_worker_started_partitions_total", MetricType::counter,
             "Partitions the scheduler started.", worker, double(s.started_tasks));
  out.single("psched_worker_finished_partitions_total", MetricType::counter,
             "Partitions whose fresh value came back (or that failed).", worker,
             double(s.finished_tasks));
  out.family("psched_worker_iteration_seconds", MetricType::histogram,
             "Time between the first pushes of consecutive steps.");
  out.histogram("psched_worker_iteration_seconds", worker, stats.iteration_seconds);
  return out.text();
}

nlohmann::json worker_status_json(const WorkerStats& stats) {
  const SchedulerStats& s = stats.scheduler;
  nlohmann::json queued = nlohmann::json::object();
  for (const auto& [priority, count] : s.queued_by_priority)
    queued[std::to_string(priority.value)] = count;
  const Histogram& iterations = stats.iteration_seconds;
  return {{"worker", stats.worker.value},
          {"credit_bytes", s.credit_bytes},
          {"push_credit_in_use_bytes", s.push_bytes_in_flight},
          {"pull_credit_in_use_bytes", s.pull_bytes_in_flight},
          {"max_push_credit_in_use_bytes", s.max_push_bytes_in_flight},
          {"max_pull_credit_in_use_bytes", s.max_pull_bytes_in_flight},
          {"queued_partitions", s.queued_tasks},
          {"queued_by_priority", queued},
          {"started_partitions", s.started_tasks},
          {"finished_partitions", s.finished_tasks},
          {"iterations", iterations.count()},
          {"mean_iteration_seconds",
           iterations.count() ? iterations.sum() / double(iterations.count()) : 0.0}};
}

HttpRoutes worker_routes(Client& client) {
  HttpRoutes routes;
  routes["/metrics"] = [&client](const HttpRequest&, HttpRespond respond) {
    client.stats([respond](WorkerStats s) {
      respond({200, std::string(kPrometheusContentType), {}, [s = std::move(s)] {
                 return worker_metrics_text(s);
               }});
    });
  };
  routes["/status"] = [&client](const HttpRequest&, HttpRespond respond) {
    client.stats([respond](WorkerStats s) {
      respond({200, "application/json", {}, [s = std::move(s)] {
                 return worker_status_json(s).dump();
               }});
    });
  };
  return routes;
}

}  // namespace psched
