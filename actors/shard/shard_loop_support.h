// SPDX-License-Identifier: Apache-2.0
// What drives a whole VariableShard on a TestLoop (actors/runtime/test_loop.h) to the end of its
// durability calls, for its tests (actors/shard/shard_test_support.h) and the benchmarks that
// run one in-process (bench/table_checkpoint_bench.cc). Free of any test framework.
#pragma once

#include <exception>
#include <filesystem>
#include <optional>
#include <utility>

#include "actors/runtime/test_loop.h"
#include "actors/shard/variable_shard.h"

namespace psched::testing {

// `shard`'s restore(), its loop `io` run until it replied; rethrows its failure.
inline RestoreReport restored(TestLoop& io, VariableShard& shard) {
  std::exception_ptr error;
  RestoreReport report;
  shard.restore([&](std::exception_ptr e, RestoreReport r) {
    error = e;
    report = std::move(r);
  });
  io.drain();
  if (error) std::rethrow_exception(error);
  return report;
}

// What `call(reply)` answers, `reply` taking (std::exception_ptr, T) and called perhaps from
// another thread (a file written, a version loaded beside): waited for on `io`, its failure
// rethrown.
template <typename T, typename Call>
T waited(TestLoop& io, const Call& call) {
  std::exception_ptr error;
  std::optional<T> value;
  auto done = kj::newPromiseAndFulfiller<void>();
  call([&](std::exception_ptr e, T v) {
    error = e;
    value.emplace(std::move(v));
    done.fulfiller->fulfill();
  });
  io.wait(kj::mv(done.promise));
  if (error) std::rethrow_exception(error);
  return std::move(*value);
}

// `shard`'s checkpoint(), waited for (the file is written on another thread); its path.
inline std::filesystem::path checkpointed(TestLoop& io, VariableShard& shard) {
  return waited<std::filesystem::path>(io, [&](auto reply) { shard.checkpoint(reply); });
}

}  // namespace psched::testing
