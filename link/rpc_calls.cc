// SPDX-License-Identifier: Apache-2.0
#include "link/rpc_calls.h"

#include "common/kj_error.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// Writes an answered value where `landing` says; rejects when it does not fit there.
kj::Promise<Landed> take_value(capnp::Data::Reader value, int64_t applied_at_ns,
                               const Landing& landing) {
  Result<> landed = landing.land({reinterpret_cast<const std::byte*>(value.begin()), value.size()});
  if (!landed) return to_kj_exception(landed.error());
  return Landed{applied_at_ns};
}

// A poll's or pushPoll's answer: the range whole or a delta, and its version.
template <typename Results>
kj::Promise<Landed> take_answer(Results r, const Landing& landing) {
  const capnp::Data::Reader value = r.getValue();
  Result<> landed = landing.land({reinterpret_cast<const std::byte*>(value.begin()), value.size()},
                                 r.getDelta() ? WireFormat::topk : landing.format, r.getVersion());
  if (!landed) return to_kj_exception(landed.error());
  return Landed{r.getAppliedAtNs()};
}

// Sets a poll's or pushPoll's delta fields.
template <typename Params>
void fill_delta(Params params, const DeltaPoll& delta) {
  if (delta.version == nullptr) return;
  params.setBaseVersion(delta.base());
  params.setDeltaCount(delta.count);
  params.setDeltaRing(delta.ring);
  params.setDeltaRefresh(delta.refresh);
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
  if constexpr (requires { params.setValueFormat(wire::WireFormat::NONE); }) {
    params.setValueFormat(to_wire(p.value_format));
    fill_delta(params, p.delta);
  }
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(p.gradient.data()), p.gradient.size());
  if (reinterpret_cast<uintptr_t>(p.gradient.data()) % sizeof(capnp::word) == 0 &&
      p.gradient.size() % sizeof(capnp::word) == 0) {
    auto orphanage = capnp::Orphanage::getForMessageContaining(params);
    params.adoptData(orphanage.referenceExternalData(data));
  } else {
    params.setData(data);
  }
}

// Sets what a pushRows and a pullRows share: the table, the step, the ids (copied).
template <typename Params>
void fill_rows(Params params, const RowsRequest& rows) {
  params.setTable(rows.table.value);
  params.setStep(rows.step.value);
  const auto ids = std::as_bytes(rows.ids);
  params.setIds(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(ids.data()), ids.size()));
}

}  // namespace

kj::Promise<void> RpcCalls::push(const PartitionRequest& part) {
  auto request = session_.pushRequest();
  fill_push(wire::Session::PushParams::Builder(request), part);
  return request.send().ignoreResult();
}

kj::Promise<Landed> RpcCalls::poll(const PartitionRequest& part) {
  auto request = session_.pollRequest();
  request.setVariable(part.variable.value);
  request.setStep(part.step.value);
  request.setOffset(part.range.begin);
  request.setCount(part.range.size());
  request.setValueFormat(to_wire(part.value_format));
  fill_delta(wire::Session::PollParams::Builder(request), part.delta);
  return request.send().then(
      [landing = part.landing()](capnp::Response<wire::Session::PollResults> r) {
        return take_answer(wire::Session::PollResults::Reader(r), landing);
      });
}

kj::Promise<Landed> RpcCalls::push_poll(const PartitionRequest& part) {
  auto request = session_.pushPollRequest();
  fill_push(wire::Session::PushPollParams::Builder(request), part);
  return request.send().then(
      [landing = part.landing()](capnp::Response<wire::Session::PushPollResults> r) {
        return take_answer(wire::Session::PushPollResults::Reader(r), landing);
      });
}

kj::Promise<void> RpcCalls::push_rows(const RowsRequest& rows) {
  auto request = session_.pushRowsRequest();
  fill_rows(wire::Session::PushRowsParams::Builder(request), rows);
  request.setDtype(to_wire(rows.dtype));
  request.setFormat(to_wire(rows.format));
  request.setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(rows.gradient.data()),
                                      rows.gradient.size()));
  return request.send().ignoreResult();
}

kj::Promise<Landed> RpcCalls::pull_rows(const RowsRequest& rows) {
  auto request = session_.pullRowsRequest();
  fill_rows(wire::Session::PullRowsParams::Builder(request), rows);
  request.setValueFormat(to_wire(rows.value_format));
  return request.send().then(
      [landing = rows.landing()](capnp::Response<wire::Session::PullRowsResults> r) {
        return take_value(r.getValue(), 0, landing);
      });
}

}  // namespace psched
