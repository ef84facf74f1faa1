// SPDX-License-Identifier: Apache-2.0
// What drives a whole VariableShard on a TestLoop (actors/runtime/test_loop.h) to the end of its
// durability calls, for its tests (actors/shard/shard_test_support.h) and the benchmarks that
// run one in-process (bench/table_checkpoint_bench.cc). Free of any test framework.
#pragma once

#include <exception>
#include <filesystem>

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

// `shard`'s checkpoint(), waited for (the file is written on another thread); its path.
inline std::filesystem::path checkpointed(TestLoop& io, VariableShard& shard) {
  std::exception_ptr error;
  std::filesystem::path file;
  auto written = kj::newPromiseAndFulfiller<void>();
  shard.checkpoint([&](std::exception_ptr e, std::filesystem::path f) {
    error = e;
    file = std::move(f);
    written.fulfiller->fulfill();
  });
  io.wait(kj::mv(written.promise));
  if (error) std::rethrow_exception(error);
  return file;
}

}  // namespace psched::testing
