// SPDX-License-Identifier: Apache-2.0
#include "link/rpc_calls.h"

#include "common/check.h"
#include "common/kj_error.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// `outcome` for every one of `parts`: a call answers its partitions together.
std::vector<Outcome> each(size_t parts, const Outcome& outcome) {
  return std::vector<Outcome>(parts, outcome);
}

// A call's refusal (or lost connection) as the outcome of each of its `parts` partitions.
kj::Promise<std::vector<Outcome>> refused_each(kj::Promise<std::vector<Outcome>> call,
                                               size_t parts) {
  return call.catch_([parts](kj::Exception&& e) { return each(parts, {from_kj_exception(e)}); });
}

// Writes an answered value into the partition's memory.
Outcome take_value(capnp::Data::Reader value, int64_t applied_at_ns, const PartitionRequest& p) {
  if (auto error = p.land({reinterpret_cast<const std::byte*>(value.begin()), value.size()}))
    return {error};
  return {std::nullopt, applied_at_ns};
}

// Sets a push's (or pushPoll's) fields. `gradient` becomes a segment of the message when it
// is word-aligned and whole words (Cap'n Proto writes up to the next word boundary): zero copy,
// the caller keeps it alive until the call is answered. Otherwise it is copied.
template <typename Params>
void fill_push(Params params, const PartitionRequest& p) {
  params.setVariable(p.variable.value);
  params.setStep(p.step.value);
  params.setOffset(p.range.begin);
  params.setDtype(to_wire(p.dtype));
  params.setFormat(to_wire(p.format));
  if constexpr (requires { params.setValueFormat(wire::WireFormat::NONE); })
    params.setValueFormat(to_wire(p.value_format));
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(p.gradient.data()), p.gradient.size());
  if (reinterpret_cast<uintptr_t>(p.gradient.data()) % sizeof(capnp::word) == 0 &&
      p.gradient.size() % sizeof(capnp::word) == 0) {
    auto orphanage = capnp::Orphanage::getForMessageContaining(params);
    params.adoptData(orphanage.referenceExternalData(data));
  } else {
    params.setData(data);
  }
}

}  // namespace

kj::Promise<std::vector<Outcome>> RpcCalls::push(std::span<const PartitionRequest> parts) {
  PSCHED_REQUIRE(parts.size() == 1, parts.size());
  auto request = session_.pushRequest();
  fill_push(wire::Session::PushParams::Builder(request), parts[0]);
  return refused_each(request.send().then([](auto) { return each(1, {}); }), 1);
}

kj::Promise<std::vector<Outcome>> RpcCalls::poll(std::span<const PartitionRequest> parts) {
  PSCHED_REQUIRE(parts.size() == 1, parts.size());
  const PartitionRequest& p = parts[0];
  auto request = session_.pollRequest();
  request.setVariable(p.variable.value);
  request.setStep(p.step.value);
  request.setOffset(p.range.begin);
  request.setCount(p.range.size());
  request.setValueFormat(to_wire(p.value_format));
  return refused_each(request.send().then([p](capnp::Response<wire::Session::PollResults> r) {
    return std::vector<Outcome>{take_value(r.getValue(), r.getAppliedAtNs(), p)};
  }),
                      1);
}

kj::Promise<std::vector<Outcome>> RpcCalls::push_poll(std::span<const PartitionRequest> parts) {
  PSCHED_REQUIRE(parts.size() == 1, parts.size());
  const PartitionRequest& p = parts[0];
  auto request = session_.pushPollRequest();
  fill_push(wire::Session::PushPollParams::Builder(request), p);
  return refused_each(request.send().then([p](capnp::Response<wire::Session::PushPollResults> r) {
    return std::vector<Outcome>{take_value(r.getValue(), r.getAppliedAtNs(), p)};
  }),
                      1);
}

}  // namespace psched
