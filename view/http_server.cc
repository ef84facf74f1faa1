// SPDX-License-Identifier: Apache-2.0
#include "view/http_server.h"

#include <array>
#include <optional>
#include <set>

#include "common/asio.h"  // first: it fixes Boost 1.74's Asio includes

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error.h"

namespace psched {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kServerName = "psched";

}  // namespace

class HttpSession;

// Shared by the server and its sessions; lives on the server's thread once it runs.
struct HttpServer::State {
  std::shared_ptr<asio::io_context> io = std::make_shared<asio::io_context>();
  tcp::acceptor acceptor{*io};
  HttpRoutes routes;
  Limits limits;
  std::set<std::shared_ptr<HttpSession>> sessions;  // open connections; the thread's only
};

// One connection: reads a request, routes it, writes the answer, and again while the client
// keeps the connection alive. Owned by State::sessions; handlers hold it while they run.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, HttpServer::State& state)
      : stream_(std::move(socket)), state_(state) {}

  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(state_.limits.header_bytes));
    parser_->body_limit(0);
    stream_.expires_after(state_.limits.read_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // Answers with `status` and closes: for requests that cannot be served.
  void refuse(http::status status, std::string_view reason) {
    keep_alive_ = false;
    write({static_cast<unsigned>(status), "text/plain; charset=utf-8", std::string(reason) + "\n"});
  }

  void write(HttpResponse answer) {
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(answer.status), 11);
    response->set(http::field::server, kServerName);
    response->set(http::field::content_type, answer.content_type);
    response->set(http::field::cache_control, "no-store");
    // Read-only data on an operator's network: the dashboard of one shard reads the others'.
    response->set(http::field::access_control_allow_origin, "*");
    if (answer.status == 405) response->set(http::field::allow, "GET");
    response->body() = answer.render_body ? answer.render_body() : std::move(answer.body);
    response->keep_alive(keep_alive_);
    response->prepare_payload();
    stream_.expires_after(state_.limits.read_timeout);
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](beast::error_code ec, size_t) {
                        if (ec) return self->close();
                        if (!self->keep_alive_) return self->linger_close();
                        self->read();
                      });
  }

  // Ends our side, then discards what the client still sends until it closes or the read
  // timeout passes: closing with unread input would reset the connection and could destroy
  // the answer before the client reads it (a 431 after huge headers, say).
  void linger_close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(state_.limits.read_timeout);
    discard();
  }

  void discard() {
    stream_.async_read_some(asio::buffer(discard_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->discard();
                            });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    state_.sessions.erase(shared_from_this());
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit)
      return refuse(http::status::request_header_fields_too_large, "request headers too large");
    if (ec == http::error::body_limit || ec == http::error::unexpected_body)
      return refuse(http::status::payload_too_large, "requests take no body");
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset)
      return close();
    if (ec) return refuse(http::status::bad_request, "malformed request");
    const auto& request = parser_->get();
    keep_alive_ = request.keep_alive();
    if (request.method() != http::verb::get)
      return refuse(http::status::method_not_allowed, "only GET is served");
    route(std::string_view(request.target().data(), request.target().size()));
  }

  void route(std::string_view target) {
    size_t mark = target.find('?');
    HttpRequest request{std::string(target.substr(0, mark)),
                        mark == target.npos ? "" : std::string(target.substr(mark + 1))};
    auto handler = state_.routes.find(request.path);
    if (handler == state_.routes.end())
      return write({404, "text/plain; charset=utf-8", "no such page: " + request.path + "\n"});
    handler->second(request, responder());
  }

  // A respond callback safe to call from any thread, even after the server is gone: it holds
  // the io_context and this session only weakly.
  HttpRespond responder() {
    std::weak_ptr<asio::io_context> io = state_.io;
    std::weak_ptr<HttpSession> session = shared_from_this();
    return [io, session](HttpResponse answer) {
      if (auto alive = io.lock())
        asio::post(*alive, [session, answer = std::move(answer)]() mutable {
          if (auto s = session.lock()) s->write(std::move(answer));
        });
    };
  }

  beast::tcp_stream stream_;
  HttpServer::State& state_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  bool keep_alive_ = false;
  std::array<char, 4096> discard_;  // what linger_close reads and drops
};

namespace {

void accept(HttpServer::State& state) {
  state.acceptor.async_accept([&state](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      auto session = std::make_shared<HttpSession>(std::move(socket), state);
      bool room = state.sessions.size() < state.limits.connections;
      state.sessions.insert(session);
      if (room) {
        session->read();
      } else {
        session->refuse(http::status::service_unavailable, "too many connections");
      }
    }
    accept(state);
  });
}

tcp::endpoint resolve(asio::io_context& io, const ListenAddress& address) {
  tcp::resolver resolver(io);
  beast::error_code ec;
  auto results =
      resolver.resolve(address.host, std::to_string(address.port), tcp::resolver::passive, ec);
  if (ec || results.empty())
    fail(ErrorCode::bad_config, "cannot listen for HTTP on {}: {}", address.to_string(),
         ec ? ec.message() : "no address");
  return results.begin()->endpoint();
}

}  // namespace

HttpServer::HttpServer(const ListenAddress& address, HttpRoutes routes, Limits limits)
    : state_(std::make_unique<State>()) {
  state_->routes = std::move(routes);
  state_->limits = limits;
  tcp::endpoint endpoint = resolve(*state_->io, address);
  beast::error_code ec;
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    fail(ErrorCode::bad_config, "cannot listen for HTTP on {}: {}", address.to_string(),
         ec.message());
  accept(*state_);
  thread_ = std::thread([io = state_->io] { io->run(); });
}

HttpServer::~HttpServer() {
  state_->io->stop();
  thread_.join();
  state_->sessions.clear();  // the thread is gone: nothing else touches them now
}

uint16_t HttpServer::port() const {
  return state_->acceptor.local_endpoint().port();
}

}  // namespace psched
