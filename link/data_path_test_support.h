// SPDX-License-Identifier: Apache-2.0
// What the tests of both DataPaths share (data_path_test: data_channel_test.cc,
// rpc_calls_test.cc): a request, and its refusal read back from the promise it rejected.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <kj/async.h>

#include "common/error.h"
#include "common/kj_error.h"
#include "link/data_path.h"

namespace psched::testing {

// A request of `gradient` (float32) for out.size() elements of variable 3 from `begin` at
// `step`; its value lands in `out`.
inline PartitionRequest request_of(std::span<const std::byte> gradient, std::vector<float>& out,
                                   Step step, uint64_t begin) {
  return {.variable = VariableId(3),
          .step = step,
          .range = {begin, begin + out.size()},
          .dtype = DType::float32,
          .gradient = gradient,
          .out = reinterpret_cast<std::byte*>(out.data()),
          .format = WireFormat::none,
          .value_format = WireFormat::none};
}

// Waits for `promise`, expecting it to reject with a psched::Error of `code` and `what`.
template <typename T>
void check_refused(kj::Promise<T> promise, kj::WaitScope& scope, ErrorCode code,
                   const std::string& what) {
  try {
    promise.wait(scope);
    FAIL("the request was answered");
  } catch (const kj::Exception& e) {
    Error error = from_kj_exception(e);
    CHECK(error.code() == code);
    CHECK(std::string(error.what()) == what);
  }
}

}  // namespace psched::testing
