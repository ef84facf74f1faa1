// SPDX-License-Identifier: Apache-2.0
#include "net/wire_convert.h"

#include <capnp/message.h>
#include <doctest/doctest.h>

using namespace psched;

TEST_CASE("a psched error crosses the wire with its code and message") {
  auto sent = to_kj_exception(
      std::make_exception_ptr(Error(ErrorCode::shape_mismatch, "push to 'w' rejected: 3 != 4")));
  CHECK(sent.getType() == kj::Exception::Type::FAILED);
  // The RPC layer prefixes received descriptions; the code must survive that.
  kj::Exception received(sent.getType(), __FILE__, __LINE__,
                         kj::str("remote exception: ", sent.getDescription()));
  Error error = from_kj_exception(received);
  CHECK(error.code() == ErrorCode::shape_mismatch);
  CHECK(std::string(error.what()) == "push to 'w' rejected: 3 != 4");
}

TEST_CASE("overload and disconnect errors keep their category") {
  auto sent = to_kj_exception(std::make_exception_ptr(Error(ErrorCode::overloaded, "busy")));
  CHECK(sent.getType() == kj::Exception::Type::OVERLOADED);
  kj::Exception dropped(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                        kj::str("Peer disconnected."));
  CHECK(from_kj_exception(dropped).code() == ErrorCode::disconnected);
}

TEST_CASE("a variable spec round-trips through the wire types") {
  VariableSpec spec;
  spec.name = "conv1/w";
  spec.shape = {64, 3, 7, 7};
  spec.dtype = DType::float64;
  spec.priority = Priority(3);
  spec.optimizer.kind = optim::OptimizerKind::adamw;
  spec.optimizer.lr = 0.002;
  spec.optimizer.weight_decay = 0.01;
  spec.optimizer.amsgrad = true;
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<wire::VariableSpec>();
  to_wire(spec, false, builder);
  VariableSpec back = from_wire(builder.asReader(), optim::OptimizerSpec{}, LimitsConfig{});
  CHECK(back.same_variable(spec));
  CHECK(back.priority == Priority(3));
}

TEST_CASE("a spec asking for the server optimizer gets the server default") {
  VariableSpec spec;
  spec.name = "b";
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<wire::VariableSpec>();
  to_wire(spec, true, builder);
  optim::OptimizerSpec server;
  server.kind = optim::OptimizerKind::adam;
  CHECK(from_wire(builder.asReader(), server, LimitsConfig{}).optimizer == server);
}

TEST_CASE("an over-long variable name is rejected naming the limit") {
  VariableSpec spec;
  spec.name = std::string(2000, 'x');
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<wire::VariableSpec>();
  to_wire(spec, false, builder);
  CHECK_THROWS_WITH_AS(from_wire(builder.asReader(), {}, LimitsConfig{}),
                       doctest::Contains("over the limit of 1024 (limits.max_name_bytes)"), Error);
}

TEST_CASE("a shape with more dimensions than the limit is rejected naming the limit") {
  VariableSpec spec{"w", std::vector<uint64_t>(33, 1), DType::float32, Priority(0), {}};
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<wire::VariableSpec>();
  to_wire(spec, false, builder);
  CHECK_THROWS_WITH_AS(
      from_wire(builder.asReader(), {}, LimitsConfig{}),
      doctest::Contains("shape of 33 dimensions is over the limit of 32 (limits.max_shape_dims)"),
      Error);
}

TEST_CASE("a shape whose byte size overflows 64 bits is rejected") {
  SUBCASE("product past 2^64") {
    VariableSpec spec{"w", {1ull << 32, 1ull << 32, 2}, DType::float32, Priority(0), {}};
    capnp::MallocMessageBuilder message;
    auto builder = message.initRoot<wire::VariableSpec>();
    to_wire(spec, false, builder);
    CHECK_THROWS_WITH_AS(from_wire(builder.asReader(), {}, LimitsConfig{}),
                         doctest::Contains("shape [4294967296, 4294967296, 2] has more than"),
                         Error);
  }
  SUBCASE("elements fit but their bytes do not") {
    VariableSpec spec{"w", {1ull << 62}, DType::float32, Priority(0), {}};
    capnp::MallocMessageBuilder message;
    auto builder = message.initRoot<wire::VariableSpec>();
    to_wire(spec, false, builder);
    CHECK_THROWS_AS(from_wire(builder.asReader(), {}, LimitsConfig{}), Error);
  }
  SUBCASE("a zero dimension is no overflow") {
    VariableSpec spec{"w", {UINT64_MAX, UINT64_MAX, 0}, DType::float32, Priority(0), {}};
    capnp::MallocMessageBuilder message;
    auto builder = message.initRoot<wire::VariableSpec>();
    to_wire(spec, false, builder);
    CHECK(from_wire(builder.asReader(), {}, LimitsConfig{}).elements() == 0);
  }
}

TEST_CASE("an unknown optimizer kind is quoted only by its start") {
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<wire::OptimizerSpec>();
  std::string kind(100000, 'k');
  builder.setKind(kind);
  try {
    from_wire(builder.asReader());
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          fmt::format("unknown optimizer '{}' (100000 bytes)", std::string(32, 'k')));
  }
}
