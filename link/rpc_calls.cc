// SPDX-License-Identifier: Apache-2.0
#include "link/rpc_calls.h"

#include <cstring>

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

// A fused call's per-partition error text ("[code] message"), or none for "".
std::optional<Error> error_of(capnp::Text::Reader text) {
  if (text.size() == 0) return std::nullopt;
  return from_description({text.cStr(), text.size()});
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

// A fused push's partitions; their gradients are copied into the message.
void fill_fused(capnp::List<wire::Partition>::Builder list,
                std::span<const PartitionRequest> parts) {
  for (unsigned i = 0; i < parts.size(); ++i) {
    const PartitionRequest& p = parts[i];
    list[i].setVariable(p.variable.value);
    list[i].setStep(p.step.value);
    list[i].setOffset(p.range.begin);
    list[i].setDtype(to_wire(p.dtype));
    list[i].setFormat(to_wire(p.format));
    list[i].setValueFormat(to_wire(p.value_format));
    list[i].setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(p.gradient.data()),
                                        p.gradient.size()));
  }
}

// Each value of a fused answer copied into its partition's memory; one outcome each.
std::vector<Outcome> take_values(capnp::List<wire::PolledValue>::Reader values,
                                 std::span<const PartitionRequest> parts) {
  if (values.size() != parts.size())
    return each(parts.size(),
                {Error(ErrorCode::internal, fmt::format("shard answered {} values to a fused "
                                                        "call of {}",
                                                        values.size(), parts.size()))});
  std::vector<Outcome> out;
  for (unsigned i = 0; i < values.size(); ++i) {
    std::optional<Error> error = error_of(values[i].getError());
    out.push_back(error ? Outcome{error}
                        : take_value(values[i].getValue(), values[i].getAppliedAtNs(), parts[i]));
  }
  return out;
}

}  // namespace

kj::Promise<std::vector<Outcome>> RpcCalls::push(std::span<const PartitionRequest> parts) {
  if (parts.size() == 1) {
    auto request = session_.pushRequest();
    fill_push(wire::Session::PushParams::Builder(request), parts[0]);
    return refused_each(request.send().then([](auto) { return each(1, {}); }), 1);
  }
  auto request = session_.pushFusedRequest();
  fill_fused(request.initPartitions(static_cast<unsigned>(parts.size())), parts);
  size_t count = parts.size();
  return refused_each(
      request.send().then([count](capnp::Response<wire::Session::PushFusedResults> r) {
        auto errors = r.getErrors();
        if (errors.size() != count)
          return each(count, {Error(ErrorCode::internal,
                                    fmt::format("shard answered {} outcomes to a fused push of {}",
                                                errors.size(), count))});
        std::vector<Outcome> out;
        for (auto text : errors) out.push_back({error_of(text)});
        return out;
      }),
      count);
}

kj::Promise<std::vector<Outcome>> RpcCalls::poll(std::span<const PartitionRequest> parts) {
  if (parts.size() == 1) {
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
  auto request = session_.pollFusedRequest();
  auto list = request.initRanges(static_cast<unsigned>(parts.size()));
  for (unsigned i = 0; i < parts.size(); ++i) {
    list[i].setVariable(parts[i].variable.value);
    list[i].setStep(parts[i].step.value);
    list[i].setOffset(parts[i].range.begin);
    list[i].setCount(parts[i].range.size());
    list[i].setValueFormat(to_wire(parts[i].value_format));
  }
  std::vector<PartitionRequest> kept(parts.begin(), parts.end());
  return refused_each(request.send().then([kept = std::move(kept)](
                                              capnp::Response<wire::Session::PollFusedResults> r) {
    return take_values(r.getValues(), kept);
  }),
                      parts.size());
}

kj::Promise<std::vector<Outcome>> RpcCalls::push_poll(std::span<const PartitionRequest> parts) {
  if (parts.size() == 1) {
    const PartitionRequest& p = parts[0];
    auto request = session_.pushPollRequest();
    fill_push(wire::Session::PushPollParams::Builder(request), p);
    return refused_each(request.send().then([p](capnp::Response<wire::Session::PushPollResults> r) {
      return std::vector<Outcome>{take_value(r.getValue(), r.getAppliedAtNs(), p)};
    }),
                        1);
  }
  auto request = session_.pushPollFusedRequest();
  fill_fused(request.initPartitions(static_cast<unsigned>(parts.size())), parts);
  std::vector<PartitionRequest> kept(parts.begin(), parts.end());
  return refused_each(
      request.send().then(
          [kept = std::move(kept)](capnp::Response<wire::Session::PushPollFusedResults> r) {
            return take_values(r.getValues(), kept);
          }),
      parts.size());
}

}  // namespace psched
