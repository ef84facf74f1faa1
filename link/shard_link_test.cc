// SPDX-License-Identifier: Apache-2.0
// ShardLink on the simulated cluster (tests/cluster.h): which data path a connection gets,
// reconnecting after a cut, and what a lost connection does to requests in flight. ctest runs
// it over both data paths (PSCHED_TEST_DATA_PATH).
#include "link/shard_link.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/kj_error.h"
#include "link/data_channel.h"
#include "link/rpc_calls.h"
#include "tests/cluster.h"
#include "tests/link_requests.h"

using namespace psched;
using namespace psched::testing;

namespace {

constexpr uint64_t kElements = 16;

struct LinkFixture {
  Cluster cluster{config()};
  std::shared_ptr<CutPlan> plan = std::make_shared<CutPlan>();
  ShardLink& link = cluster.open_reconnecting_link(0, plan);
  std::vector<float> initial = std::vector<float>(kElements, 2.f);

  static DeploymentConfig config() {
    DeploymentConfig c = cluster_config(1, 2, Mode::async);
    c.optimizer.lr = 1.0;
    return c;
  }
  VariableId connect_and_register() {
    cluster.run(link.connect(WorkerId(0), ""));
    VariableSpec spec{"w", {kElements}, DType::float32, Priority(0), {}};
    return cluster.run(link.register_part(spec, true, {0, kElements}, as_bytes(initial)));
  }
  static std::span<const std::byte> as_bytes(const std::vector<float>& v) {
    return std::as_bytes(std::span(v));
  }
  // What a request in flight gets when its connection is cut: [disconnected], naming the
  // stream that was lost (the test's cut over a data stream; Cap'n Proto's "Peer
  // disconnected" over calls).
  void check_lost(const kj::Exception& e) const {
    Error error = from_kj_exception(e);
    CHECK(error.code() == ErrorCode::disconnected);
    std::string what = error.what();
    CAPTURE(what);
    if (cluster.data_path() == DataPathKind::stream)
      CHECK(what == "data stream to the shard lost: connection cut by the test");
    else
      CHECK(what == "connection to the shard lost: remote exception: Peer disconnected.");
  }
  std::vector<float> pulled(VariableId id) {
    std::vector<float> out(kElements);
    cluster.run(
        link.pull(id, {0, kElements}, reinterpret_cast<std::byte*>(out.data()), kElements * 4));
    return out;
  }
};

}  // namespace

TEST_CASE(
    "a connection's data path is chosen once: a data stream when the link asks, else "
    "Cap'n Proto calls") {
  LinkFixture f;
  CHECK(f.link.data_path() == nullptr);  // not connected yet
  f.connect_and_register();
  REQUIRE(f.link.data_path() != nullptr);
  bool stream = f.cluster.data_path() == DataPathKind::stream;
  CHECK(f.link.has_data_stream() == stream);
  CHECK((dynamic_cast<DataChannel*>(f.link.data_path()) != nullptr) == stream);
  CHECK((dynamic_cast<RpcCalls*>(f.link.data_path()) != nullptr) == !stream);
}

TEST_CASE("a link whose connection is cut reconnects and registers its parts again, same ids") {
  LinkFixture f;
  VariableId id = f.connect_and_register();
  uint64_t epoch = f.link.epoch();
  std::vector<float> grad(kElements, 1.f);
  f.plan->bytes_left = 0;  // the next byte written is lost with the connection
  try {
    f.cluster.run(push(f.link, id, Step(1), {0, kElements}, DType::float32, f.as_bytes(grad)));
    FAIL("a push over a cut connection was answered");
  } catch (const kj::Exception& e) {
    f.check_lost(e);
  }
  CHECK(f.plan->cuts == 1);
  f.cluster.run(f.link.recover(epoch));
  CHECK(f.link.epoch() == epoch + 1);
  f.cluster.run(f.link.recover(epoch));  // already recovered: at once
  CHECK(f.link.epoch() == epoch + 1);
  // The push may or may not have reached the shard; resent, it is applied once.
  f.cluster.run(push(f.link, id, Step(1), {0, kElements}, DType::float32, f.as_bytes(grad)));
  CHECK(f.pulled(id) == std::vector<float>(kElements, 1.f));
}

TEST_CASE("a connection cut while it is set up is tried again, not given up") {
  for (uint64_t after : {0ul, 8ul, 40ul}) {  // inside the first messages of connect()
    CAPTURE(after);
    LinkFixture f;
    f.plan->bytes_left = after;
    VariableId id = f.connect_and_register();
    CHECK(f.plan->cuts == 1);
    CHECK(f.pulled(id) == f.initial);
  }
}

TEST_CASE("a poll waiting when its connection is lost ends [disconnected]; the link goes on") {
  LinkFixture f;
  VariableId id = f.connect_and_register();
  std::vector<float> fresh(kElements);
  auto waiting = poll(f.link, id, Step(1), {0, kElements},
                      reinterpret_cast<std::byte*>(fresh.data()), kElements * 4);
  f.cluster.settle();
  uint64_t epoch = f.link.epoch();
  f.plan->bytes_left = 0;
  std::vector<float> grad(kElements, 1.f);
  auto pushed = push(f.link, id, Step(1), {0, kElements}, DType::float32, f.as_bytes(grad));
  try {
    f.cluster.run(kj::mv(waiting));
    FAIL("a poll over a lost connection was answered");
  } catch (const kj::Exception& e) {
    f.check_lost(e);
  }
  try {
    f.cluster.run(kj::mv(pushed));
    FAIL("a push over a lost connection was answered");
  } catch (const kj::Exception& e) {
    f.check_lost(e);
  }
  f.cluster.run(f.link.recover(epoch));
  f.cluster.run(push(f.link, id, Step(1), {0, kElements}, DType::float32, f.as_bytes(grad)));
  f.cluster.run(poll(f.link, id, Step(1), {0, kElements},
                     reinterpret_cast<std::byte*>(fresh.data()), kElements * 4));
  CHECK(fresh == std::vector<float>(kElements, 1.f));
}

TEST_CASE("a cut link recovers with its table, and a resent push of rows applies once") {
  LinkFixture f;
  f.cluster.run(f.link.connect(WorkerId(0), ""));
  TableSpec spec{.name = "emb", .num_embeddings = 10, .dim = 2};
  spec.optimizer.lr = 1.0;
  const VariableId table = f.cluster.run(f.link.register_table(spec));
  const uint64_t epoch = f.link.epoch();
  const std::vector<uint64_t> ids{3};
  const std::vector<float> grad{1, 1};
  RowsRequest push{.table = table,
                   .step = Step(1),
                   .ids = ids,
                   .dim = 2,
                   .gradient = f.as_bytes(grad),
                   .push = true};
  f.plan->bytes_left = 0;  // the next byte written is lost with the connection
  try {
    f.cluster.run(f.link.data_path()->push_rows(push));
    FAIL("a push over a cut connection was answered");
  } catch (const kj::Exception& e) {
    f.check_lost(e);
  }
  f.cluster.run(f.link.recover(epoch));
  CHECK(f.link.epoch() == epoch + 1);
  f.cluster.run(f.link.data_path()->push_rows(push));
  std::vector<float> out(2);
  RowsRequest pull{.table = table,
                   .step = Step(1),
                   .ids = ids,
                   .dim = 2,
                   .out = reinterpret_cast<std::byte*>(out.data())};
  f.cluster.run(f.link.data_path()->pull_rows(pull));
  CHECK(out == std::vector<float>{-1, -1});  // zeros at first, one update of lr 1
}

TEST_CASE(
    "a reconnection that reaches another shard at the address is refused, nothing registered") {
  DeploymentConfig config = cluster_config(2, 1, Mode::async);
  Cluster cluster{config};
  auto plan = std::make_shared<CutPlan>();
  ShardLink& link = cluster.open_reconnecting_link(0, plan, /*later=*/1);
  cluster.run(link.connect(WorkerId(0), ""));
  const std::vector<float> initial(kElements, 2.f);
  VariableSpec spec{"w", {kElements}, DType::float32, Priority(0), {}};
  const VariableId id = cluster.run(
      link.register_part(spec, true, {0, kElements}, std::as_bytes(std::span(initial))));
  const uint64_t epoch = link.epoch();
  plan->bytes_left = 0;
  const std::vector<float> grad(kElements, 1.f);
  CHECK_THROWS(cluster.run(
      push(link, id, Step(1), {0, kElements}, DType::float32, std::as_bytes(std::span(grad)))));
  try {
    cluster.run(link.recover(epoch));
    FAIL("a reconnection to shard 1 was taken for shard 0");
  } catch (const kj::Exception& e) {
    const Error error = from_kj_exception(e);
    CHECK(error.code() == ErrorCode::bad_config);
    const std::string what = error.what();
    CAPTURE(what);
    CHECK(what.find("cannot be used again: it came back as shard 1 of job") != std::string::npos);
    CHECK(what.find("not shard 0 of job") != std::string::npos);
    CHECK(what.ends_with("restart the worker to take the job's placement anew"));
  }
  CHECK(link.epoch() == epoch);  // the connection to shard 1 never became the link's
}
