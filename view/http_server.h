// SPDX-License-Identifier: Apache-2.0
// HttpServer: a small HTTP/1.1 server (Boost.Beast) for the operator view: GET routes whose
// handlers answer through a callback, from any thread, so a handler can ask an actor for a
// snapshot and answer when the actor replies. It runs on its own io_context and thread, so a
// slow or hostile client never touches the actors' threads.
//
//   HttpServer server(parse_listen_address("127.0.0.1:9410"),
//                     {{"/metrics", [](const HttpRequest&, HttpRespond respond) {
//                       respond({.content_type = "text/plain", .body = "..."});
//                     }}});
//
// Bad requests get HTTP errors: 404 (unknown path), 405 (not GET), 431 (headers over
// Limits::header_bytes), 400 (malformed), 503 (over Limits::connections); a client that does
// not send a whole request within Limits::read_timeout is disconnected.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "config/deployment.h"

namespace psched {

struct HttpRequest {
  std::string path;   // target without the query, e.g. "/status"
  std::string query;  // after '?', may be empty
};

struct HttpResponse {
  unsigned status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // When set, makes the body on the server's thread: a handler answering from an actor's
  // loop hands over its snapshot and leaves the rendering off that loop.
  std::function<std::string()> render_body = {};
};

// Answers one request; call it exactly once, from any thread.
using HttpRespond = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(const HttpRequest&, HttpRespond)>;
using HttpRoutes = std::map<std::string, HttpHandler, std::less<>>;  // by exact path

class HttpServer {
 public:
  struct Limits {
    size_t header_bytes = 8 << 10;
    std::chrono::seconds read_timeout{10};  // for a whole request, and an idle keep-alive
    size_t connections = 64;                // open at once; more are answered 503
  };

  // Binds `address` and serves `routes` on a thread of its own. Throws psched::Error
  // (bad_config) naming the address when it cannot be bound. Handlers run on that thread.
  HttpServer(const ListenAddress& address, HttpRoutes routes, Limits limits);
  HttpServer(const ListenAddress& address, HttpRoutes routes)
      : HttpServer(address, std::move(routes), Limits{}) {}
  // Stops serving and joins the thread. Responses that arrive later are dropped.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the one asked for, or the kernel's pick for port 0).
  uint16_t port() const;

  struct State;  // the acceptor, routes and sessions (http_server.cc)

 private:
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace psched
