// SPDX-License-Identifier: Apache-2.0
#include "server/shard_monitor.h"

#include "server/dashboard_html.h"
#include "view/metrics.h"

namespace psched {

ShardMonitor::ShardMonitor(VariableShard& shard, const ShardListener& listener,
                           const DeploymentConfig& config, ShardId id)
    : shard_(shard),
      listener_(listener),
      config_(config),
      id_(id),
      server_(config.shards.at(id.value).http, routes()) {}

void ShardMonitor::snapshot(bool with_variables, std::function<void(ShardSnapshot)> done) {
  auto uptime = std::chrono::steady_clock::now() - started_;
  ShardSnapshot base{
      id_, {}, {}, listener_.connections(), std::chrono::duration<double>(uptime).count()};
  // The replies may run after the monitor is gone: they capture nothing of it.
  shard_.stats(
      [&shard = shard_, base, with_variables, done = std::move(done)](ShardStats stats) mutable {
        base.stats = std::move(stats);
        if (!with_variables) return done(std::move(base));
        shard.variables(kStatusVariables, [base = std::move(base), done = std::move(done)](
                                              std::vector<VariableStatus> variables) mutable {
          base.variables = std::move(variables);
          done(std::move(base));
        });
      });
}

HttpRoutes ShardMonitor::routes() {
  HttpRoutes routes;
  routes["/metrics"] = [this](const HttpRequest&, HttpRespond respond) {
    snapshot(false, [respond](ShardSnapshot s) {
      respond({200, std::string(kPrometheusContentType), {}, [s = std::move(s)] {
                 return shard_metrics_text(s);
               }});
    });
  };
  routes["/status"] = [this](const HttpRequest&, HttpRespond respond) {
    snapshot(true, [&config = config_, respond](ShardSnapshot s) {
      respond({200, "application/json", {}, [s = std::move(s), &config] {
                 return shard_status_json(s, config).dump();
               }});
    });
  };
  routes["/membership"] = [this](const HttpRequest&, HttpRespond respond) {
    // The reply may run after the monitor is gone: it captures nothing of it.
    shard_.short_handed(
        VariableShard::kShortHandedKept, [respond](std::vector<ShortHanded> records) {
          respond({200, "application/json", {}, [r = std::move(records)] {
                     return nlohmann::json{{"short_handed", short_handed_json(r)}}.dump();
                   }});
        });
  };
  routes["/"] = [](const HttpRequest&, HttpRespond respond) {
    respond({200, "text/html; charset=utf-8", std::string(kDashboardHtml)});
  };
  return routes;
}

}  // namespace psched
