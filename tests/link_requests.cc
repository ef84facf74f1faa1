// SPDX-License-Identifier: Apache-2.0
#include "tests/link_requests.h"

#include "common/check.h"
#include "common/kj_error.h"

namespace psched::testing {
namespace {

// What a request before connect() gets: the link has no path yet.
kj::Exception not_open() {
  return to_kj_exception(
      Error(ErrorCode::invalid_argument, "request before connect: the shard session is not open"));
}

// The shard's time of a landed value.
constexpr auto kAppliedAt = [](Landed value) { return value.applied_at_ns; };

PartitionRequest part_of(VariableId variable, Step step, ElementRange range, DType dtype,
                         std::span<const std::byte> gradient, std::byte* out, size_t out_bytes) {
  PartitionRequest part{.variable = variable,
                        .step = step,
                        .range = range,
                        .dtype = dtype,
                        .gradient = gradient,
                        .out = out};
  if (out != nullptr)
    PSCHED_REQUIRE(out_bytes == part.landing().bytes(), out_bytes, part.landing().bytes());
  return part;
}

}  // namespace

kj::Promise<void> push(ShardLink& link, VariableId variable, Step step, ElementRange range,
                       DType dtype, std::span<const std::byte> gradient) {
  DataPath* path = link.data_path();
  if (path == nullptr) return not_open();
  return path->push(part_of(variable, step, range, dtype, gradient, nullptr, 0))
      .attach(link.hold());
}

kj::Promise<int64_t> poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                          std::byte* out, size_t out_bytes) {
  DataPath* path = link.data_path();
  if (path == nullptr) return not_open();
  return path->poll(part_of(variable, step, range, DType::float32, {}, out, out_bytes))
      .then(kAppliedAt)
      .attach(link.hold());
}

kj::Promise<int64_t> push_poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                               DType dtype, std::span<const std::byte> gradient, std::byte* out,
                               size_t out_bytes) {
  DataPath* path = link.data_path();
  if (path == nullptr) return not_open();
  return path->push_poll(part_of(variable, step, range, dtype, gradient, out, out_bytes))
      .then(kAppliedAt)
      .attach(link.hold());
}

}  // namespace psched::testing
