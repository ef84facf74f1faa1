// SPDX-License-Identifier: Apache-2.0
#include "tests/link_requests.h"

#include "common/check.h"
#include "common/kj_error.h"

namespace psched::testing {
namespace {

using Send = kj::Promise<std::vector<Outcome>> (DataPath::*)(std::span<const PartitionRequest>);

// `send` of `parts` on the link's current path, the connection held until it is answered.
kj::Promise<std::vector<Outcome>> on_path(ShardLink& link, Send send,
                                          std::span<const PartitionRequest> parts) {
  DataPath* path = link.data_path();
  if (path == nullptr)
    return to_kj_exception(Error(ErrorCode::invalid_argument,
                                 "request before connect: the shard session is not open"));
  return (path->*send)(parts).attach(link.hold());
}

// The single outcome's value: its applied time, or its error as a rejection.
kj::Promise<int64_t> single(ShardLink& link, Send send, PartitionRequest part) {
  auto kept = kj::heap<PartitionRequest>(part);
  auto sent = on_path(link, send, {kept.get(), 1});
  return sent
      .then([](std::vector<Outcome> outcomes) -> kj::Promise<int64_t> {
        if (outcomes.at(0).error) return to_kj_exception(*outcomes[0].error);
        return outcomes[0].applied_at_ns;
      })
      .attach(kj::mv(kept));
}

PartitionRequest part_of(VariableId variable, Step step, ElementRange range, DType dtype,
                         std::span<const std::byte> gradient, std::byte* out, size_t out_bytes) {
  PartitionRequest part{.variable = variable,
                        .step = step,
                        .range = range,
                        .dtype = dtype,
                        .gradient = gradient,
                        .out = out};
  if (out != nullptr) PSCHED_REQUIRE(out_bytes == part.bytes(), out_bytes, part.bytes());
  return part;
}

}  // namespace

kj::Promise<void> push(ShardLink& link, VariableId variable, Step step, ElementRange range,
                       DType dtype, std::span<const std::byte> gradient) {
  return single(link, &DataPath::push, part_of(variable, step, range, dtype, gradient, nullptr, 0))
      .ignoreResult();
}

kj::Promise<int64_t> poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                          std::byte* out, size_t out_bytes) {
  return single(link, &DataPath::poll,
                part_of(variable, step, range, DType::float32, {}, out, out_bytes));
}

kj::Promise<int64_t> push_poll(ShardLink& link, VariableId variable, Step step, ElementRange range,
                               DType dtype, std::span<const std::byte> gradient, std::byte* out,
                               size_t out_bytes) {
  return single(link, &DataPath::push_poll,
                part_of(variable, step, range, dtype, gradient, out, out_bytes));
}

}  // namespace psched::testing
