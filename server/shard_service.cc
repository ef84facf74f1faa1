// SPDX-License-Identifier: Apache-2.0
#include "server/shard_service.h"

#include <algorithm>
#include <memory>
#include <random>

#include "common/wall_clock.h"
#include "net/data_frame.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

// "" for success, else the exception's "[code] message".
kj::Promise<kj::String> error_text(kj::Promise<void> call) {
  return call.then([] { return kj::str(""); },
                   [](kj::Exception&& e) { return kj::str(e.getDescription()); });
}

// The exception that answers a request the service refused before it reached the shard,
// which counts it for the operator view.
kj::Exception refuse(ShardEndpoint& endpoint, std::exception_ptr error) {
  endpoint.shard.report_error(error);
  return to_kj_exception(error);
}

// Values at least this large are referenced rather than copied. Below it the copy is cheap
// and a one-segment message is cheaper to send and read: at 4 KiB referencing cost 10-15% more
// CPU per byte (psched-transport-bench --sizes 4KiB, three runs each way).
constexpr size_t kReferencedValueBytes = 64 * 1024;

// Puts `value` into an answer's `value` field. A large value is referenced where it lives, in
// the variable's memory, when that is whole words at a word boundary (Cap'n Proto's condition
// for an external segment): its bytes leave from there, with no zeroed buffer to fill and no
// copy. The shard outlives its connections' messages (ShardHost), so the memory outlives the
// answer.
template <typename Answer>
void put_value(Answer answer, const FreshValue& value) {
  std::span<const std::byte> bytes = value.in_place();
  capnp::Data::Reader data(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size());
  if (bytes.size() >= kReferencedValueBytes &&
      reinterpret_cast<uintptr_t>(bytes.data()) % sizeof(capnp::word) == 0 &&
      bytes.size() % sizeof(capnp::word) == 0)
    answer.adoptValue(
        capnp::Orphanage::getForMessageContaining(answer).referenceExternalData(data));
  else
    answer.setValue(data);
}

// Puts a ready value into an answer: poll's, pushPoll's, or one slot of a fused answer.
template <typename Answer>
void write_answer(Answer answer, const FreshValue& value, int64_t answered_at_ns) {
  put_value(answer, value);
  answer.setAppliedStep(value.step().value);
  answer.setAppliedAtNs(answered_at_ns);
}

// What writes a ready value into slot `i` of a fused answer.
template <typename Context>
auto slot_writer(Context context, unsigned i) {
  return [context, i](const FreshValue& value, int64_t at_ns) mutable {
    write_answer(context.getResults().getValues()[i], value, at_ns);
  };
}

// Answers a fused call (pollFused, pushPollFused) slot by slot: `answer(i)` writes slot i's
// value when it is ready; a refusal becomes the slot's error text. Resolves when all are in.
template <typename Context, typename Answer>
kj::Promise<void> answer_each(Context context, unsigned slots, Answer answer) {
  context.getResults().initValues(slots);
  auto outcomes = kj::heapArrayBuilder<kj::Promise<void>>(slots);
  for (unsigned i = 0; i < slots; ++i)
    outcomes.add(answer(i).catch_([context, i](kj::Exception&& e) mutable {
      context.getResults().getValues()[i].setError(e.getDescription());
    }));
  return kj::joinPromises(outcomes.finish());
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

kj::Exception ShardService::refuse_connect(Error error) {
  if (admission_ && ticket_) admission_->refused("connect", *ticket_, error.what());
  return refuse(endpoint_, std::make_exception_ptr(std::move(error)));
}

kj::Promise<void> ShardService::connect(ConnectContext context) {
  auto params = context.getParams();
  const DeploymentConfig& config = endpoint_.config;
  auto token = params.getToken();
  if (token.size() > config.limits.max_token_bytes)
    return refuse_connect(Error(ErrorCode::invalid_argument,
                                fmt::format("connect rejected: token of {} bytes is over the "
                                            "limit of {} (limits.max_token_bytes)",
                                            token.size(), config.limits.max_token_bytes)));
  if (!config.auth_token.empty() &&
      !constant_time_equal(std::string_view(token.cStr(), token.size()), config.auth_token))
    return refuse_connect(
        Error(ErrorCode::bad_token,
              fmt::format("connect to shard {} rejected: wrong auth token", endpoint_.id.value)));
  if (params.getWorkerId() >= config.workers)
    return refuse_connect(
        Error(ErrorCode::invalid_argument,
              fmt::format("connect rejected: worker id {} is not below the job's {} workers",
                          params.getWorkerId(), config.workers)));
  if (admission_ && ticket_) {
    try {
      admission_->authenticate(*ticket_);  // logs its own refusal
    } catch (...) {
      return refuse(endpoint_, std::current_exception());
    }
  }

  auto results = context.getResults();
  results.setSession(
      kj::heap<SessionService>(endpoint_, WorkerId(params.getWorkerId()), kj::addRef(*order_)));
  auto layout = results.initLayout();
  layout.setShardIndex(endpoint_.id.value);
  auto addresses = layout.initShardAddresses(static_cast<unsigned>(config.shards.size()));
  for (unsigned i = 0; i < config.shards.size(); ++i)
    addresses.set(i, config.shards[i].listen.to_string());
  layout.setSplitBytes(config.split_bytes);
  layout.setMode(to_wire(config.mode));
  layout.setWorkers(config.workers);
  layout.setMaxMessageBytes(config.limits.max_message_bytes);
  to_wire(config.optimizer, layout.initDefaultOptimizer());
  return kj::READY_NOW;
}

void SessionService::check_fused(const char* what, size_t parts) const {
  uint64_t limit = endpoint_.config.limits.max_fused_partitions;
  if (parts > limit)
    fail(ErrorCode::invalid_argument,
         "{} rejected: {} partitions are over the limit of {} (limits.max_fused_partitions)", what,
         parts, limit);
}

kj::Promise<void> SessionService::register_(RegisterContext context) {
  auto params = context.getParams();
  VariableSpec spec;
  try {
    spec = from_wire(params.getSpec(), endpoint_.config.optimizer, endpoint_.config.limits);
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
  auto initial = params.getInitialValue();
  auto [promise, f] = reply_promise<std::pair<VariableId, bool>>();
  endpoint_.shard.register_variable(
      kj::mv(spec), {params.getBegin(), params.getEnd()},
      {reinterpret_cast<const std::byte*>(initial.begin()), initial.size()},
      // f = f: clang 14 (the fuzz build) cannot capture a structured binding by name.
      [f = f](std::exception_ptr error, VariableId id, bool created) {
        if (error) return (*f)->reject(to_kj_exception(error));
        (*f)->fulfill(std::make_pair(id, created));
      });
  return promise.then([context](std::pair<VariableId, bool> r) mutable {
    context.getResults().setVariable(r.first.value);
    context.getResults().setCreated(r.second);
  });
}

template <typename Fields>
PushArgs SessionService::decode_push(Fields fields) const {
  const capnp::Data::Reader data = fields.getData();
  return check_push(endpoint_.config.limits, fields.getVariable(), fields.getStep(),
                    fields.getOffset(), from_wire(fields.getDtype()),
                    {reinterpret_cast<const std::byte*>(data.begin()), data.size()});
}

kj::Promise<void> SessionService::push_one(const PushArgs& push) {
  auto [promise, f] = reply_promise<void>();
  endpoint_.shard.push(worker_, push.variable, push.step, push.range, push.dtype, push.data,
                       [f = f](std::exception_ptr error) {
                         if (error) return (*f)->reject(to_kj_exception(error));
                         (*f)->fulfill();
                       });
  return kj::mv(promise);
}

kj::Promise<void> SessionService::push(PushContext context) {
  auto params = context.getParams();
  try {
    return push_one(decode_push(params));
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

kj::Promise<void> SessionService::pushFused(PushFusedContext context) {
  auto partitions = context.getParams().getPartitions();
  try {
    check_fused("pushFused", partitions.size());
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
  auto outcomes = kj::heapArrayBuilder<kj::Promise<kj::String>>(partitions.size());
  // Each partition goes to the shard in list order, so they apply in that order.
  for (auto p : partitions) {
    try {
      outcomes.add(error_text(push_one(decode_push(p))));
    } catch (...) {
      outcomes.add(error_text(refuse(endpoint_, std::current_exception())));
    }
  }
  return kj::joinPromises(outcomes.finish()).then([context](kj::Array<kj::String> errors) mutable {
    auto out = context.getResults().initErrors(static_cast<unsigned>(errors.size()));
    for (unsigned i = 0; i < errors.size(); ++i) out.set(i, errors[i]);
  });
}

void SessionService::check_answer_fits(capnp::List<wire::PolledRange>::Reader ranges) const {
  uint64_t limit = endpoint_.config.limits.max_message_bytes, elements = 0;
  for (auto r : ranges) {
    elements += std::min<uint64_t>(r.getCount(), limit);  // stays below 2 x limit
    if (elements > limit / sizeof(float))
      fail(ErrorCode::message_too_large,
           "pollFused rejected: its ranges hold over {} elements, which do not fit the message "
           "limit of {} bytes (limits.max_message_bytes)",
           limit / sizeof(float), limit);
  }
}

kj::Promise<void> SessionService::poll_one(VariableId variable, Step step, uint64_t offset,
                                           uint64_t count, WriteValue write) {
  ElementRange r = checked_range("poll", offset, count);
  check_poll_room(endpoint_.config.limits, *waiting_polls_);
  ++*waiting_polls_;
  auto [promise, f] = reply_promise<void>();
  PollTicket ticket(endpoint_.next_poll_ticket++);
  endpoint_.shard.poll(worker_, variable, step, r, ticket,
                       [f = f, write = std::move(write),
                        order = std::make_shared<kj::Own<AnswerOrder>>(kj::addRef(*order_))](
                           std::exception_ptr error, const FreshValue* value) {
                         if (error) return (*f)->reject(to_kj_exception(error));
                         write(*value, wall_clock_ns());
                         (*order)->submit(value->priority(), value->bytes(), kj::mv(*f));
                       });
  // A poll may wait long; when its caller goes away (cancel, dropped connection) the promise
  // is dropped and the shard forgets the poll at once, before the call's results (which
  // `write` fills) go away. Polls borrow nothing from their parameters.
  VariableShard& shard = endpoint_.shard;
  std::weak_ptr<bool> alive = endpoint_.alive;
  return promise.attach(kj::defer([&shard, alive, ticket, waiting = waiting_polls_] {
    --*waiting;
    if (alive.lock()) shard.withdraw_poll(ticket);
  }));
}

kj::Promise<void> SessionService::poll(PollContext context) {
  auto params = context.getParams();
  try {
    auto answered =
        poll_one(VariableId(params.getVariable()), Step(params.getStep()), params.getOffset(),
                 params.getCount(), [context](const FreshValue& value, int64_t at_ns) mutable {
                   write_answer(context.getResults(), value, at_ns);
                 });
    context.allowCancellation();
    return answered;
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

kj::Promise<void> SessionService::pollFused(PollFusedContext context) {
  auto ranges = context.getParams().getRanges();
  try {
    check_fused("pollFused", ranges.size());
    check_answer_fits(ranges);
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
  context.allowCancellation();
  return answer_each(context, ranges.size(), [&](unsigned i) -> kj::Promise<void> {
    auto r = ranges[i];
    try {
      return poll_one(VariableId(r.getVariable()), Step(r.getStep()), r.getOffset(), r.getCount(),
                      slot_writer(context, i));
    } catch (...) {
      return refuse(endpoint_, std::current_exception());
    }
  });
}

kj::Promise<void> SessionService::push_then_poll(const PushArgs& push, WriteValue write) {
  // Before the push: a refused call must leave the variable untouched.
  check_poll_room(endpoint_.config.limits, *waiting_polls_);
  auto pushed = push_one(push);
  // Filed behind the push on the shard's loop; dropped, and so withdrawn, if the push is refused.
  auto answered =
      poll_one(push.variable, push.step, push.range.begin, push.range.size(), std::move(write));
  return pushed.then([answered = kj::mv(answered)]() mutable { return kj::mv(answered); });
}

kj::Promise<void> SessionService::pushPoll(PushPollContext context) {
  auto params = context.getParams();
  try {
    return push_then_poll(decode_push(params),
                          [context](const FreshValue& value, int64_t at_ns) mutable {
                            write_answer(context.getResults(), value, at_ns);
                          });
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

kj::Promise<void> SessionService::pushPollFused(PushPollFusedContext context) {
  auto partitions = context.getParams().getPartitions();
  try {
    check_fused("pushPollFused", partitions.size());
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
  // Each partition goes to the shard in list order, so they apply in that order.
  return answer_each(context, partitions.size(), [&](unsigned i) -> kj::Promise<void> {
    auto p = partitions[i];
    try {
      return push_then_poll(decode_push(p), slot_writer(context, i));
    } catch (...) {
      return refuse(endpoint_, std::current_exception());
    }
  });
}

SessionService::~SessionService() {
  if (!data_key_.empty()) endpoint_.data_keys.erase(data_key_);
}

kj::Promise<void> SessionService::openDataStream(OpenDataStreamContext context) {
  if (!data_key_.empty()) endpoint_.data_keys.erase(data_key_);  // one unused key at a time
  data_key_ = random_data_key();
  endpoint_.data_keys.emplace(data_key_, worker_);
  context.getResults().setKey(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(data_key_.data()), data_key_.size()));
  return kj::READY_NOW;
}

kj::Promise<void> SessionService::pull(PullContext context) {
  auto params = context.getParams();
  try {
    ElementRange r = checked_range("pull", params.getOffset(), params.getCount());
    auto [promise, f] = reply_promise<void>();
    endpoint_.shard.pull(
        VariableId(params.getVariable()), r,
        [f = f, context](std::exception_ptr error, const FreshValue* value) mutable {
          if (error) return (*f)->reject(to_kj_exception(error));
          auto results = context.getResults();
          put_value(results, *value);
          results.setAppliedStep(value->step().value);
          (*f)->fulfill();
        });
    return kj::mv(promise);
  } catch (...) {
    return refuse(endpoint_, std::current_exception());
  }
}

}  // namespace psched
