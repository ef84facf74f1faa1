// SPDX-License-Identifier: Apache-2.0
// The operator view of a worker: GET /metrics (Prometheus) and GET /status (JSON) for a
// Client, served by an HttpServer (view/http_server.h) the application owns:
//
//   psched::Client client(...);
//   psched::HttpServer http(psched::parse_listen_address("127.0.0.1:9500"),
//                           psched::worker_routes(client));  // destroy before the client
//
// Each request takes a snapshot from the worker's scheduler actor (Client::stats).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "view/http_server.h"

namespace psched {

// /metrics and /status for `client`, which outlives the server that serves them.
HttpRoutes worker_routes(Client& client);

// The Prometheus text of `stats` (samples labelled worker="<id>").
std::string worker_metrics_text(const WorkerStats& stats);
nlohmann::json worker_status_json(const WorkerStats& stats);

}  // namespace psched
