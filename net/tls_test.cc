// SPDX-License-Identifier: Apache-2.0
#include "net/tls.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include "common/error.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

const std::filesystem::path kCerts = std::filesystem::path(PSCHED_SOURCE_DIR) / "tests/tls";

ConfigFile cert_file(const std::string& name, const std::string& key) {
  return {.path = kCerts / name, .origin = "x.yaml:3: tls." + key};
}

// tests/tls/: server.pem (localhost, 127.0.0.1) signed by ca.pem.
TlsConfig test_tls(const std::string& ca = "ca.pem") {
  return {.cert_file = cert_file("server.pem", "cert_file"),
          .key_file = cert_file("server.key", "key_file"),
          .ca_file = cert_file(ca, "ca_file"),
          .server_name = {}};
}

// A shard's and a worker's TLS ends of one in-memory pipe, on one event loop.
struct Handshake {
  kj::EventLoop loop;
  kj::WaitScope scope{loop};
  kj::Own<kj::TlsContext> server;
  kj::Own<kj::TlsContext> client;

  explicit Handshake(const TlsConfig& config)
      : server(server_tls_context(config)), client(client_tls_context(config)) {}

  // The worker's encrypted stream once both ends agree; throws the worker's Error otherwise.
  kj::Own<kj::AsyncIoStream> run(const std::string& server_name) {
    auto pipe = kj::newTwoWayPipe();
    auto accepted = server->wrapServer(kj::mv(pipe.ends[0])).eagerlyEvaluate([](kj::Exception&&) {
      return kj::Own<kj::AsyncIoStream>();
    });
    try {
      return tls_client_handshake(*client, kj::mv(pipe.ends[1]), "127.0.0.1:7410", server_name)
          .wait(scope);
    } catch (const kj::Exception& e) {
      throw from_kj_exception(e);
    }
  }
};

std::string handshake_error(const TlsConfig& config, const std::string& server_name) {
  Handshake handshake(config);
  try {
    handshake.run(server_name);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    return e.what();
  }
  FAIL("expected the handshake to fail");
  return {};
}

std::string config_error(const std::function<void()>& make_context) {
  try {
    make_context();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    return e.what();
  }
  FAIL("expected Error(bad_config)");
  return {};
}

TEST_CASE("a worker completes the handshake with a shard whose certificate its CA signed") {
  Handshake handshake(test_tls());
  for (const char* name : {"localhost", "127.0.0.1"}) {
    CAPTURE(name);
    CHECK(handshake.run(name).get() != nullptr);
  }
}

TEST_CASE("a worker that does not trust the shard's CA fails naming the shard's address") {
  std::string message = handshake_error(test_tls("other_ca.pem"), "localhost");
  CHECK(message.starts_with("TLS handshake with shard at 127.0.0.1:7410 failed"));
  CHECK(message.find("not trusted") != std::string::npos);
}

TEST_CASE("a certificate that does not name the expected host is refused") {
  std::string message = handshake_error(test_tls(), "shard7.example.com");
  CHECK(
      message.starts_with("TLS handshake with shard at 127.0.0.1:7410 failed (expected a "
                          "certificate for 'shard7.example.com'"));
}

TEST_CASE("a shard that hangs up during the handshake is a disconnect") {
  kj::EventLoop loop;
  kj::WaitScope scope(loop);
  auto client = client_tls_context(test_tls());
  auto pipe = kj::newTwoWayPipe();
  pipe.ends[0] = nullptr;
  try {
    tls_client_handshake(*client, kj::mv(pipe.ends[1]), "127.0.0.1:7410", "localhost").wait(scope);
    FAIL("the handshake succeeded");
  } catch (const kj::Exception& e) {
    Error error = from_kj_exception(e);
    CHECK_MESSAGE(error.code() == ErrorCode::disconnected, error.what());
    CHECK(
        std::string(error.what()).starts_with("TLS handshake with shard at 127.0.0.1:7410 failed"));
  }
}

TEST_CASE("workers expect the listen host unless tls.server_name names another") {
  TlsConfig config = test_tls();
  CHECK(expected_server_name(config, "127.0.0.1:7410") == "127.0.0.1");
  CHECK(expected_server_name(config, "[::1]:7410") == "::1");
  config.server_name = "psched-shard";
  CHECK(expected_server_name(config, "10.0.0.7:7410") == "psched-shard");
}

TEST_CASE("unusable TLS files are errors naming the YAML key and the file") {
  TlsConfig config = test_tls();
  SUBCASE("missing") {
    config.cert_file.path = kCerts / "nope.pem";
    CHECK(config_error([&] { server_tls_context(config); }) ==
          "x.yaml:3: tls.cert_file: cannot open '" + (kCerts / "nope.pem").string() +
              "': No such file or directory");
  }
  SUBCASE("a directory") {
    config.ca_file.path = kCerts;
    CHECK(config_error([&] { client_tls_context(config); }) ==
          "x.yaml:3: tls.ca_file: '" + kCerts.string() + "' is a directory");
  }
  SUBCASE("no PEM") {
    config.cert_file = cert_file("README.md", "cert_file");
    CHECK(config_error([&] { server_tls_context(config); })
              .starts_with("x.yaml:3: tls.cert_file: '" + (kCerts / "README.md").string() +
                           "' is not a PEM certificate: "));
    config = test_tls("README.md");
    CHECK(config_error([&] { client_tls_context(config); }) == "x.yaml:3: tls.ca_file: '" +
                                                                   (kCerts / "README.md").string() +
                                                                   "' holds no PEM certificate");
    config = test_tls();
    config.key_file = cert_file("server.pem", "key_file");
    CHECK(config_error([&] { server_tls_context(config); })
              .starts_with("x.yaml:3: tls.key_file: '" + (kCerts / "server.pem").string() +
                           "' is not an unencrypted PEM private key: "));
  }
  SUBCASE("a key that is not the certificate's") {
    config.cert_file = cert_file("ca.pem", "cert_file");
    CHECK(config_error([&] { server_tls_context(config); }) ==
          "x.yaml:3: tls.key_file: '" + (kCerts / "server.key").string() +
              "' is not the private key of " + (kCerts / "ca.pem").string());
  }
}

}  // namespace
}  // namespace psched
