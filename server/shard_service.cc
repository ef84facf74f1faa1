// SPDX-License-Identifier: Apache-2.0
#include "server/shard_service.h"

#include <optional>
#include <random>

#include "net/data_frame.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// Values at least this large are referenced rather than copied. Below it the copy is cheap
// and a one-segment message is cheaper to send and read: at 4 KiB referencing cost 10-15% more
// CPU per byte (psched-transport-bench --sizes 4KiB, three runs each way).
constexpr size_t kReferencedValueBytes = 64 * 1024;
// What an answer's message costs beside its value, for the ReturnWindow.
constexpr uint64_t kReturnOverheadBytes = 64;

// Puts `answer`'s value into a result's `value` field. A large value is referenced where it
// lives, in the variable's memory, when that is whole words at a word boundary (Cap'n Proto's
// condition for an external segment): its bytes leave from there, with no zeroed buffer to fill
// and no copy. The shard outlives its connections' messages (ShardHost), so the memory outlives
// the answer. A value in memory of the answer's own (narrowed, or rows gathered from a table)
// is copied: that memory goes back to its pool with the answer, before the message leaves.
template <typename Results>
void put_value(Results results, const Answer& answer) {
  const std::span<const std::byte> bytes = answer.value;
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size());
  if (!answer.narrowed && bytes.size() >= kReferencedValueBytes &&
      reinterpret_cast<uintptr_t>(bytes.data()) % sizeof(capnp::word) == 0 &&
      bytes.size() % sizeof(capnp::word) == 0)
    results.adoptValue(
        capnp::Orphanage::getForMessageContaining(results).referenceExternalData(data));
  else
    results.setValue(data);
}

// Puts a value answer into poll's or pushPoll's results.
template <typename Results>
void put_answer(Results results, const Answer& answer) {
  put_value(results, answer);
  results.setAppliedStep(answer.applied_step.value);
  results.setAppliedAtNs(answer.applied_at_ns);
  results.setDelta(answer.format == WireFormat::topk);
  results.setVersion(answer.version);
}

// A poll's or pushPoll's delta fields (actors/shard/value_deltas.h).
template <typename Fields>
DeltaAsk delta_ask(Fields fields) {
  return {fields.getBaseVersion(), fields.getDeltaCount(), fields.getDeltaRing(),
          fields.getDeltaRefresh()};
}

// A push's or pushPoll's fields as a request to the plane; a dtype not on the wire makes it one
// the plane refuses.
template <typename Fields>
Request push_request(RequestKind kind, Fields fields) {
  const capnp::Data::Reader data = fields.getData();
  Request request{.kind = kind,
                  .variable = fields.getVariable(),
                  .step = fields.getStep(),
                  .offset = fields.getOffset(),
                  .gradient = {reinterpret_cast<const std::byte*>(data.begin()), data.size()}};
  try {
    request.dtype = from_wire(fields.getDtype());
    request.format = from_wire(fields.getFormat());
    if constexpr (requires { fields.getValueFormat(); }) {
      request.value_format = from_wire(fields.getValueFormat());
      request.delta = delta_ask(fields);
    }
  } catch (const Error& e) {
    request.refused = e;
  }
  return request;
}

// A poll's fields as a request to the plane.
template <typename Fields>
Request poll_request(Fields fields) {
  Request request{.kind = RequestKind::poll,
                  .variable = fields.getVariable(),
                  .step = fields.getStep(),
                  .offset = fields.getOffset(),
                  .count = fields.getCount(),
                  .delta = delta_ask(fields)};
  try {
    request.value_format = from_wire(fields.getValueFormat());
  } catch (const Error& e) {
    request.refused = e;
  }
  return request;
}

// The exception that answers a call refused before it reached the plane; the shard counts it
// for the operator view.
kj::Exception refused(ShardEndpoint& endpoint, const Error& error) {
  endpoint.shard.report_error(error);
  return to_kj_exception(error);
}

// kDataKeyBytes random bytes.
std::string random_data_key() {
  std::random_device random;
  std::string key(kDataKeyBytes, '\0');
  for (char& c : key) c = static_cast<char>(random());
  return key;
}

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

kj::Exception ShardService::refuse_connect(const Error& error) {
  if (admission_ && ticket_) admission_->refused("connect", *ticket_, error.what());
  return refused(endpoint_, error);
}

std::optional<Error> ShardService::refusal(capnp::Text::Reader token, uint32_t worker) const {
  const DeploymentConfig& config = endpoint_.config;
  if (token.size() > config.limits.max_token_bytes)
    return Error(ErrorCode::invalid_argument,
                 fmt::format("connect rejected: token of {} bytes is over the limit of {} "
                             "(limits.max_token_bytes)",
                             token.size(), config.limits.max_token_bytes));
  if (!config.auth_token.empty() &&
      !constant_time_equal(std::string_view(token.cStr(), token.size()), config.auth_token))
    return Error(ErrorCode::bad_token,
                 fmt::format("connect to shard {} rejected: wrong auth token", endpoint_.id.value));
  if (worker >= config.workers)
    return Error(ErrorCode::invalid_argument,
                 fmt::format("connect rejected: worker id {} is not below the job's {} workers",
                             worker, config.workers));
  return std::nullopt;
}

void ShardService::put_layout(wire::ClusterLayout::Builder layout) const {
  const DeploymentConfig& config = endpoint_.config;
  layout.setShardIndex(endpoint_.id.value);
  auto addresses = layout.initShardAddresses(static_cast<unsigned>(config.shards.size()));
  for (unsigned i = 0; i < config.shards.size(); ++i)
    addresses.set(i, config.shards[i].listen.to_string());
  layout.setSplitBytes(config.split_bytes);
  layout.setMode(to_wire(config.mode));
  layout.setWorkers(config.workers);
  layout.setMaxMessageBytes(config.limits.max_message_bytes);
  to_wire(config.optimizer, layout.initDefaultOptimizer());
  layout.setJob(endpoint_.shard.job());
  const SlotMap& map = endpoint_.shard.slot_map();
  layout.setSlotEpoch(map.epoch());
  auto owners = layout.initSlotOwners(SlotMap::kSlots);
  for (uint32_t slot = 0; slot < SlotMap::kSlots; ++slot)
    owners.set(slot, static_cast<uint16_t>(map.owner(slot)));
}

kj::Promise<void> ShardService::connect(ConnectContext context) {
  auto params = context.getParams();
  if (std::optional<Error> why = refusal(params.getToken(), params.getWorkerId()))
    return refuse_connect(*why);
  if (admission_ && ticket_) {
    try {
      admission_->authenticate(*ticket_);  // logs its own refusal
    } catch (const Error& e) {
      return refused(endpoint_, e);
    }
  }
  auto results = context.getResults();
  results.setSession(
      kj::heap<SessionService>(endpoint_, WorkerId(params.getWorkerId()), kj::addRef(*window_)));
  put_layout(results.initLayout());
  return kj::READY_NOW;
}

SessionService::SessionService(ShardEndpoint& endpoint, WorkerId worker,
                               kj::Own<ReturnWindow> window)
    : endpoint_(endpoint),
      endpoint_alive_(endpoint.alive),
      worker_(worker),
      window_(kj::mv(window)),
      plane_(std::make_shared<DataPlane>(endpoint, worker, static_cast<AnswerWriter&>(*this))) {
  window_->watch(plane_);
  endpoint_.shard.connected(worker_);
}

SessionService::~SessionService() {
  // A session may be destroyed with the event loop, after its endpoint and shard.
  if (endpoint_alive_.expired()) return;
  if (!data_key_.empty()) endpoint_.data_keys.erase(data_key_);
  endpoint_.shard.disconnected(worker_);
}

kj::Promise<void> SessionService::join(JoinContext context) {
  auto paf = kj::newPromiseAndFulfiller<uint64_t>();
  auto done = std::make_shared<kj::Own<kj::PromiseFulfiller<uint64_t>>>(kj::mv(paf.fulfiller));
  endpoint_.shard.join(worker_, Step(context.getParams().getAtLeast()),
                       [done](const Result<Step>& from) {
                         if (!from) return (*done)->reject(to_kj_exception(from.error()));
                         (*done)->fulfill(uint64_t{from->value});
                       });
  return paf.promise.then([context](uint64_t step) mutable { context.getResults().setStep(step); });
}

kj::Promise<void> SessionService::ask(Request request, Write write) {
  uint64_t id = request.id = next_id();
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto done = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
  unanswered_.emplace(id, [done, write = std::move(write)](const Answer& answer) {
    if (answer.kind == AnswerKind::error) return (*done)->reject(to_kj_exception(*answer.error));
    write(answer);
    (*done)->fulfill();
  });
  plane_->serve(std::move(request));
  return paf.promise.attach(kj::defer([this, id, alive = std::weak_ptr<bool>(alive_)] {
    if (alive.lock()) forget(id);
  }));
}

void SessionService::forget(uint64_t id) {
  if (unanswered_.erase(id) > 0) plane_->cancel(id);
}

void SessionService::take(Answer& answer) {
  auto it = unanswered_.find(answer.id);
  if (it == unanswered_.end()) return;  // its call went away
  Write settle = std::move(it->second);
  unanswered_.erase(it);
  window_->sent(kReturnOverheadBytes + answer.value.size());
  settle(answer);
}

kj::Promise<void> SessionService::register_(RegisterContext context) {
  auto params = context.getParams();
  VariableSpec spec;
  try {
    spec = from_wire(params.getSpec(), endpoint_.config.optimizer, endpoint_.config.limits);
  } catch (const Error& e) {
    return refused(endpoint_, e);
  }
  auto initial = params.getInitialValue();
  auto [promise, f] = reply_promise<VariableShard::Registration>();
  endpoint_.shard.register_variable(
      kj::mv(spec), {params.getBegin(), params.getEnd()},
      {reinterpret_cast<const std::byte*>(initial.begin()), initial.size()},
      // f = f: clang 14 (the fuzz build) cannot capture a structured binding by name.
      [f = f](const Result<VariableShard::Registration>& registered) {
        if (!registered) return (*f)->reject(to_kj_exception(registered.error()));
        (*f)->fulfill(VariableShard::Registration(*registered));
      });
  return promise.then([context](VariableShard::Registration r) mutable {
    context.getResults().setVariable(r.id.value);
    context.getResults().setCreated(r.created);
  });
}

kj::Promise<void> SessionService::push(PushContext context) {
  return ask(push_request(RequestKind::push, context.getParams()), [](const Answer&) {});
}

kj::Promise<void> SessionService::poll(PollContext context) {
  context.allowCancellation();
  return ask(poll_request(context.getParams()),
             [context](const Answer& answer) mutable { put_answer(context.getResults(), answer); });
}

kj::Promise<void> SessionService::pushPoll(PushPollContext context) {
  return ask(push_request(RequestKind::push_poll, context.getParams()),
             [context](const Answer& answer) mutable { put_answer(context.getResults(), answer); });
}

kj::Promise<void> SessionService::pull(PullContext context) {
  auto params = context.getParams();
  return ask({.kind = RequestKind::pull,
              .variable = params.getVariable(),
              .offset = params.getOffset(),
              .count = params.getCount()},
             [context](const Answer& answer) mutable {
               auto results = context.getResults();
               put_value(results, answer);
               results.setAppliedStep(answer.applied_step.value);
             });
}

kj::Promise<void> SessionService::registerTable(RegisterTableContext context) {
  TableSpec spec;
  try {
    spec = from_wire(context.getParams().getSpec(), endpoint_.config.limits);
  } catch (const Error& e) {
    return refused(endpoint_, e);
  }
  auto [promise, f] = reply_promise<VariableShard::Registration>();
  endpoint_.shard.register_table(kj::mv(spec),
                                 [f = f](const Result<VariableShard::Registration>& registered) {
                                   if (!registered)
                                     return (*f)->reject(to_kj_exception(registered.error()));
                                   (*f)->fulfill(VariableShard::Registration(*registered));
                                 });
  return promise.then([context](VariableShard::Registration r) mutable {
    context.getResults().setTable(r.id.value);
    context.getResults().setCreated(r.created);
  });
}

kj::Promise<void> SessionService::pushRows(PushRowsContext context) {
  auto params = context.getParams();
  const capnp::Data::Reader ids = params.getIds(), data = params.getData();
  Request request{.kind = RequestKind::push_rows,
                  .variable = params.getTable(),
                  .step = params.getStep(),
                  .gradient = {reinterpret_cast<const std::byte*>(data.begin()), data.size()},
                  .ids = {reinterpret_cast<const std::byte*>(ids.begin()), ids.size()}};
  try {
    request.dtype = from_wire(params.getDtype());
    request.format = from_wire(params.getFormat());
  } catch (const Error& e) {
    request.refused = e;
  }
  return ask(std::move(request), [](const Answer&) {});
}

kj::Promise<void> SessionService::pullRows(PullRowsContext context) {
  context.allowCancellation();
  auto params = context.getParams();
  const capnp::Data::Reader ids = params.getIds();
  Request request{.kind = RequestKind::pull_rows,
                  .variable = params.getTable(),
                  .step = params.getStep(),
                  .ids = {reinterpret_cast<const std::byte*>(ids.begin()), ids.size()}};
  try {
    request.value_format = from_wire(params.getValueFormat());
  } catch (const Error& e) {
    request.refused = e;
  }
  return ask(std::move(request), [context](const Answer& answer) mutable {
    auto results = context.getResults();
    put_value(results, answer);
    results.setAppliedStep(answer.applied_step.value);
  });
}

kj::Promise<void> SessionService::openDataStream(OpenDataStreamContext context) {
  if (!data_key_.empty()) endpoint_.data_keys.erase(data_key_);  // one unused key at a time
  data_key_ = random_data_key();
  endpoint_.data_keys.emplace(data_key_, worker_);
  context.getResults().setKey(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(data_key_.data()), data_key_.size()));
  return kj::READY_NOW;
}

}  // namespace psched
