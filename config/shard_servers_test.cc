// SPDX-License-Identifier: Apache-2.0
// Servers joining and leaving a job: the fewest shards move, the file says so, and what cannot
// be done is refused naming why.
#include "config/shard_servers.h"

#include <map>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "common/error.h"

namespace psched {
namespace {

// `shards` shards, shard i on servers[i * servers.size() / shards] (contiguous runs).
std::string job_yaml(size_t shards, const std::vector<std::string>& servers) {
  std::string text = "mode: sync\nworkers: 2\ncheckpoint: {directory: ckpt}\nservers:\n";
  for (size_t s = 0; s < servers.size(); ++s)
    text += fmt::format("  - {{name: {}, control: 127.0.0.1:{}}}\n", servers[s], 9500 + s);
  text += "shards:  # a comment the rewrite drops\n";
  for (size_t i = 0; i < shards; ++i)
    text += fmt::format("  - {{listen: 127.0.0.1:{}, server: {}}}\n", 7000 + i,
                        servers[i * servers.size() / shards]);
  return text;
}

std::map<std::string, size_t> counts(const DeploymentConfig& config) {
  std::map<std::string, size_t> out;
  for (const ShardConfig& shard : config.shards) out[shard.server]++;
  return out;
}

std::string refusal(auto&& call) {
  try {
    call();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::bad_config);
    return e.what();
  }
  FAIL("expected a refusal");
  return {};
}

const ServerConfig kNew{"c", {"10.0.0.3", 9600}};

}  // namespace

TEST_CASE("a server that joins takes the fewest shards that balance the servers") {
  for (const auto& expected : {std::pair<size_t, size_t>{4, 1}, {6, 2}, {12, 4}, {3, 1}}) {
    const size_t shards = expected.first, moved = expected.second;
    CAPTURE(shards);
    const DeploymentConfig before = parse_deployment(job_yaml(shards, {"a", "b"}), "x.yaml");
    std::vector<ShardMove> moves;
    const DeploymentConfig after = with_server_added(before, kNew, moves);
    CHECK(moves.size() == moved);
    CHECK(counts(after)["c"] == moved);
    CHECK(after.servers.back() == kNew);
    for (const ShardMove& move : moves) {
      const ShardConfig& shard = after.shards[move.shard.value];
      CHECK(move.to == "c");
      CHECK(before.shards[move.shard.value].server == move.from);
      CHECK(shard.listen.to_string() == fmt::format("10.0.0.3:{}", 7000 + move.shard.value));
      CHECK(shard.http.port == before.shards[move.shard.value].http.port);
    }
    // The rest stay where they were, and the file written says all of it.
    size_t unchanged = 0;
    for (size_t i = 0; i < shards; ++i) unchanged += after.shards[i] == before.shards[i];
    CHECK(unchanged == shards - moved);
    DeploymentConfig read =
        parse_deployment(rewrite_placement(job_yaml(shards, {"a", "b"}), after), "x.yaml");
    CHECK(read.shards == after.shards);
    CHECK(read.servers == after.servers);
    CHECK(read.checkpoint == after.checkpoint);
  }
}

TEST_CASE("a server that leaves gives each of its shards to the server holding the fewest") {
  const DeploymentConfig before = parse_deployment(job_yaml(12, {"a", "b", "c"}), "x.yaml");
  std::vector<ShardMove> moves;
  const DeploymentConfig after = with_server_removed(before, "b", moves);
  CHECK(moves.size() == 4);  // b's four, no other
  CHECK(counts(after) == std::map<std::string, size_t>{{"a", 6}, {"c", 6}});
  CHECK(after.servers.size() == 2);
  for (const ShardMove& move : moves) CHECK(move.from == "b");
}

TEST_CASE("a shard moved to a host where its port is taken takes the next free one") {
  const std::string yaml =
      "servers:\n  - {name: a, control: 10.0.0.1:9500}\n  - {name: b, control: 10.0.0.2:9500}\n"
      "shards:\n"
      "  - {listen: 10.0.0.1:7000, http: 10.0.0.1:8000, server: a}\n"
      "  - {listen: 10.0.0.2:7000, http: 10.0.0.2:8000, server: b}\n"
      "  - {listen: 10.0.0.2:7001, http: 127.0.0.1:8001, server: b}\n";
  const DeploymentConfig before = parse_deployment(yaml, "x.yaml");
  std::vector<ShardMove> moves;
  const DeploymentConfig after = with_server_removed(before, "a", moves);
  REQUIRE(moves.size() == 1);
  CHECK(after.shards[0].listen.to_string() == "10.0.0.2:9501");  // past b's control port
  CHECK(after.shards[0].http.to_string() == "10.0.0.2:9502");
  const DeploymentConfig read = parse_deployment(rewrite_placement(yaml, after), "x.yaml");
  CHECK(read.shards == after.shards);
}

TEST_CASE("what cannot be moved is refused naming why") {
  const DeploymentConfig two = parse_deployment(job_yaml(2, {"a", "b"}), "x.yaml");
  std::vector<ShardMove> moves;
  CHECK(refusal([&] { with_server_added(two, kNew, moves); }).find("would hold none") !=
        std::string::npos);
  CHECK(refusal([&] {
          with_server_added(two, {"a", {"10.0.0.3", 1}}, moves);
        }).find("server a is already") != std::string::npos);
  CHECK(refusal([&] {
          with_server_added(two, {"d", {"127.0.0.1", 9501}}, moves);
        }).find("already server b's control address") != std::string::npos);
  CHECK(refusal([&] { with_server_removed(two, "z", moves); }).find("no server z") !=
        std::string::npos);
  const DeploymentConfig one = parse_deployment(job_yaml(2, {"a"}), "x.yaml");
  CHECK(refusal([&] { with_server_removed(one, "a", moves); }).find("the only server") !=
        std::string::npos);
  const DeploymentConfig plain =
      parse_deployment("shards:\n  - {listen: 127.0.0.1:7000}\n", "x.yaml");
  CHECK(refusal([&] { with_server_added(plain, kNew, moves); }).find("has no servers:") !=
        std::string::npos);
  CHECK(moves.empty());
}

TEST_CASE("servers: are checked when the file is read") {
  auto error = [](const std::string& yaml) {
    return refusal([&] { parse_deployment(yaml, "x.yaml"); });
  };
  CHECK(error("servers:\n  - {name: a, control: 127.0.0.1:9500}\nshards:\n"
              "  - {listen: 127.0.0.1:7000}\n")
            .find("no server:") != std::string::npos);
  CHECK(error("servers:\n  - {name: a, control: 127.0.0.1:9500}\nshards:\n"
              "  - {listen: 127.0.0.1:7000, server: b}\n")
            .find("server 'b' is not in servers:") != std::string::npos);
  CHECK(error("shards:\n  - {listen: 127.0.0.1:7000, server: a}\n").find("needs a servers:") !=
        std::string::npos);
  CHECK(error("servers:\n  - {name: a, control: 127.0.0.1:9500}\n"
              "  - {name: a, control: 127.0.0.1:9501}\nshards:\n"
              "  - {listen: 127.0.0.1:7000, server: a}\n")
            .find("a is also another server's") != std::string::npos);
  CHECK(error("servers:\n  - {name: 'a b', control: 127.0.0.1:9500}\nshards:\n"
              "  - {listen: 127.0.0.1:7000, server: a}\n")
            .find("is not a server name") != std::string::npos);
  CHECK(error("servers:\n  - {name: a, control: 127.0.0.1:8000}\nshards:\n"
              "  - {listen: 127.0.0.1:7000, server: a}\n")
            .find("also server a's control address") != std::string::npos);
}

}  // namespace psched
