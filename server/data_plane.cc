// SPDX-License-Identifier: Apache-2.0
#include "server/data_plane.h"

#include <tuple>

#include "common/log.h"
#include "common/wall_clock.h"
#include "compression/codec.h"
#include "server/request_checks.h"

namespace psched {

DataPlane::DataPlane(ShardEndpoint& endpoint, WorkerId worker, AnswerWriter& writer)
    : endpoint_(endpoint),
      alive_(endpoint.alive),
      worker_(worker),
      writer_(writer),
      tasks_(*this) {}

DataPlane::~DataPlane() noexcept {
  if (!alive_.lock()) return;
  for (auto& [id, ticket] : polls_) endpoint_.shard.withdraw_poll(ticket);
}

void DataPlane::serve(Request request) {
  if (request.refused) return refuse(request.id, *request.refused);
  switch (request.kind) {
    case RequestKind::push:
      return push(request, false);
    case RequestKind::push_poll:
      return push(request, true);
    case RequestKind::poll:
      return poll(request);
    case RequestKind::pull:
      return pull(request);
    case RequestKind::push_rows:
      return push_rows(request);
    case RequestKind::pull_rows:
      return pull_rows(request);
  }
}

void DataPlane::push(const Request& r, bool then_poll) {
  Push push;
  std::shared_ptr<AlignedBuffer> widened;
  try {
    if (then_poll) check_value_format(r.value_format);
    if (r.format != WireFormat::none) widened = widen(r);
    push =
        check_push(limits(), worker_, r.variable, r.step, r.offset, r.dtype,
                   widened ? widened->bytes() : r.gradient,
                   r.format == WireFormat::topk ? PushedGradient::sparse : PushedGradient::whole);
    if (then_poll) check_new_poll(r.id);
  } catch (const Error& e) {
    return refuse(r.id, e);
  }
  VariableShard::Receipt receipt = receipt_of(r, push, then_poll, std::move(widened));
  if (!then_poll) return endpoint_.shard.push(push, std::move(receipt));
  const Poll poll{worker_, push.variable, push.step, push.range, new_poll(r.id)};
  endpoint_.shard.push_poll(push, poll.ticket, std::move(receipt),
                            value_reply(r.id, poll, r.value_format, r.delta));
}

VariableShard::Receipt DataPlane::receipt_of(const Request& r, const Push& push, bool then_poll,
                                             std::shared_ptr<AlignedBuffer> widened) {
  ShardTrace::TimePoint received = trace_time();
  // A call arrives whole: its receive phase is empty.
  ShardTrace::TimePoint arrived = r.arrived == ShardTrace::TimePoint{} ? received : r.arrived;
  ShardTrace::Request traced{ShardTrace::Kind::push,
                             worker_,
                             push.variable,
                             push.step,
                             push.range,
                             r.gradient.size(),
                             r.format,
                             Priority(0),
                             arrived,
                             received,
                             {}};
  return [weak = weak_from_this(), id = r.id, then_poll, bytes = r.gradient.size(),
          raw = push.data.size(), keeps = r.keeps_gradient, widened = std::move(widened),
          traced](const Result<>& taken) {
    auto plane = weak.lock();
    if (!plane) return;
    if (!taken) {
      plane->polls_.erase(id);  // a push_poll's: its poll was never filed
      return plane->queue_error(id, taken.error());
    }
    plane->endpoint_.shard.count_wire_bytes(true, raw, bytes);
    plane->record(traced);
    if (!then_poll) plane->queue(Answer::receipt(id));
  };
}

std::shared_ptr<AlignedBuffer> DataPlane::widen(const Request& r) const {
  const uint64_t elements = decoded_elements(r.format, r.dtype, r.gradient);
  const uint64_t bytes = elements * element_bytes(r.dtype);
  if (bytes > limits().max_message_bytes)
    fail(ErrorCode::message_too_large,
         "push to variable id {} rejected: its {} body decodes to {} bytes, over the message "
         "limit of {} bytes (limits.max_message_bytes)",
         r.variable, to_string(r.format), bytes, limits().max_message_bytes);
  if (!decodes_finite(r.format, r.dtype, r.gradient))
    fail(ErrorCode::invalid_argument,
         "push to variable id {} step {} rejected: its {} gradient decodes to an infinity or a "
         "NaN (nothing applied)",
         r.variable, r.step, to_string(r.format));
  auto widened = endpoint_.receive_buffers->take(bytes);
  decode(r.format, r.dtype, r.gradient, widened->bytes());
  return widened;
}

void DataPlane::narrow(Answer& answer) {
  const uint64_t raw = answer.value.size();
  if (answer.delta && answer_delta(answer)) return;
  if (answer.format != WireFormat::none) {
    const uint64_t elements = raw / element_bytes(answer.dtype);
    auto narrowed =
        endpoint_.receive_buffers->take(encoded_bytes(answer.format, answer.dtype, elements));
    narrow_values(answer.format, answer.dtype, answer.value, narrowed->bytes());
    answer.value = narrowed->bytes();
    answer.narrowed = std::move(narrowed);
  }
  endpoint_.shard.count_wire_bytes(false, raw, answer.value.size());
}

bool DataPlane::answer_delta(Answer& answer) {
  const uint64_t raw = answer.value.size();
  auto body = std::make_shared<std::vector<std::byte>>();
  const DeltaReply reply = endpoint_.shard.answer_delta(answer.delta->variable, answer.delta->range,
                                                        answer.value, answer.delta->ask, *body);
  answer.version = reply.version;
  if (!reply.delta) {
    if (reply.full.empty()) return false;  // no such variable here: the values as they are
    // P whole, what the worker's later deltas start from, copied: P changes with the next
    // delta, and the range's copy goes when workers cut it anew, before the answer is written.
    auto whole = std::make_shared<std::vector<std::byte>>(reply.full.begin(), reply.full.end());
    answer.value = *whole;
    answer.narrowed = std::move(whole);
    return false;
  }
  answer.format = WireFormat::topk;
  answer.value = *body;
  answer.narrowed = std::move(body);
  endpoint_.shard.count_wire_bytes(false, raw, answer.value.size());
  return true;
}

void DataPlane::poll(const Request& r) {
  ElementRange range;
  try {
    range = checked_range("poll", r.offset, r.count);
    check_value_format(r.value_format);
    check_new_poll(r.id);
  } catch (const Error& e) {
    return refuse(r.id, e);
  }
  const Poll poll{worker_, VariableId(r.variable), Step(r.step), range, new_poll(r.id)};
  endpoint_.shard.poll(poll, value_reply(r.id, poll, r.value_format, r.delta));
}

void DataPlane::pull(const Request& r) {
  ElementRange range;
  try {
    range = checked_range("pull", r.offset, r.count);
    check_value_format(r.value_format);
  } catch (const Error& e) {
    return refuse(r.id, e);
  }
  endpoint_.shard.pull(VariableId(r.variable), range,
                       [weak = weak_from_this(), id = r.id,
                        format = r.value_format](const Result<FreshValue>& value) {
                         auto plane = weak.lock();
                         if (!plane) return;
                         if (!value) return plane->queue_error(id, value.error());
                         Answer answer = plane->fresh_answer(id, *value, format);
                         answer.applied_at_ns = 0;
                         plane->queue(std::move(answer));
                       });
}

void DataPlane::push_rows(const Request& r) {
  std::shared_ptr<const std::vector<uint64_t>> ids;
  std::shared_ptr<AlignedBuffer> widened;
  try {
    ids = std::make_shared<const std::vector<uint64_t>>(
        checked_ids("push", r.variable, r.ids, limits()));
    check_row_format("push", r.variable, r.format);
    check_poll_room("push of rows", limits(), polls_.size() + receipts_waiting_);
    if (r.format != WireFormat::none) widened = widen(r);
  } catch (const Error& e) {
    return refuse(r.id, e);
  }
  const std::span<const std::byte> rows = widened ? widened->bytes() : r.gradient;
  const Push push{.worker = worker_,
                  .variable = VariableId(r.variable),
                  .step = Step(r.step),
                  .dtype = r.dtype,
                  .data = rows,
                  .rows = true,
                  .ids = *ids};
  auto held =
      std::make_shared<std::tuple<decltype(ids), decltype(widened), decltype(r.keeps_gradient)>>(
          ids, std::move(widened), r.keeps_gradient);
  ++receipts_waiting_;  // until the shard takes it: at once, unless it holds it (sync)
  endpoint_.shard.push(push, rows_receipt(r, rows.size(), std::move(held)));
}

VariableShard::Receipt DataPlane::rows_receipt(const Request& r, uint64_t raw,
                                               std::shared_ptr<const void> held) {
  return [weak = weak_from_this(), id = r.id, sent = r.gradient.size(), raw,
          held = std::move(held)](const Result<>& taken) {
    auto plane = weak.lock();
    if (!plane) return;
    --plane->receipts_waiting_;
    if (!taken) return plane->queue_error(id, taken.error());
    plane->endpoint_.shard.count_wire_bytes(true, raw, sent);
    plane->queue(Answer::receipt(id));
  };
}

void DataPlane::pull_rows(const Request& r) {
  std::shared_ptr<const std::vector<uint64_t>> ids;
  try {
    ids = std::make_shared<const std::vector<uint64_t>>(
        checked_ids("pull", r.variable, r.ids, limits()));
    check_row_format("pull", r.variable, r.value_format);
    check_new_poll(r.id);
  } catch (const Error& e) {
    return refuse(r.id, e);
  }
  const Poll pull{worker_, VariableId(r.variable), Step(r.step), {}, new_poll(r.id), true, *ids};
  endpoint_.shard.poll(pull, rows_reply(r.id, r.value_format, std::move(ids)));
}

VariableShard::ValueReply DataPlane::rows_reply(uint64_t id, WireFormat format,
                                                std::shared_ptr<const std::vector<uint64_t>> ids) {
  return
      [weak = weak_from_this(), id, format, ids = std::move(ids)](const Result<FreshValue>& rows) {
        auto plane = weak.lock();
        if (!plane) return;
        plane->polls_.erase(id);
        if (!rows) return plane->queue_error(id, rows.error());
        plane->queue(plane->fresh_answer(id, *rows, format));
      };
}

void DataPlane::check_new_poll(uint64_t id) const {
  check_poll_room("poll", limits(), polls_.size() + receipts_waiting_);
  if (polls_.contains(id))
    fail(ErrorCode::invalid_argument, "request id {} is already waiting on this connection", id);
}

PollTicket DataPlane::new_poll(uint64_t id) {
  PollTicket ticket(endpoint_.next_poll_ticket++);
  polls_.emplace(id, ticket);
  return ticket;
}

VariableShard::ValueReply DataPlane::value_reply(uint64_t id, const Poll& poll, WireFormat format,
                                                 const DeltaAsk& delta) {
  return [weak = weak_from_this(), id, poll, format, delta,
          filed_at = trace_time()](const Result<FreshValue>& value) {
    auto plane = weak.lock();
    if (!plane) return;
    plane->polls_.erase(id);
    if (!value) return plane->queue_error(id, value.error());
    plane->queue(plane->value_answer(id, poll, format, delta, *value, filed_at));
  };
}

Answer DataPlane::fresh_answer(uint64_t id, const FreshValue& value, WireFormat format) const {
  std::span<const std::byte> bytes = value.in_place();
  std::shared_ptr<AlignedBuffer> copy;
  if (bytes.empty() && value.bytes() > 0) {
    copy = endpoint_.receive_buffers->take(value.bytes());
    value.read_into(copy->bytes());
    bytes = copy->bytes();
  }
  Answer answer = Answer::fresh_value(id, value.priority(), value.step(), bytes, value.dtype(),
                                      format, wall_clock_ns());
  answer.narrowed = std::move(copy);
  return answer;
}

Answer DataPlane::value_answer(uint64_t id, const Poll& poll, WireFormat format,
                               const DeltaAsk& delta, const FreshValue& value,
                               ShardTrace::TimePoint filed_at) const {
  Answer answer = fresh_answer(id, value, format);
  if (delta.count > 0) answer.delta = Answer::DeltaPoll{poll.variable, poll.range, delta};
  if (tracing())
    answer.traced = {ShardTrace::Kind::poll,
                     worker_,
                     poll.variable,
                     poll.step,
                     poll.range,
                     encoded_bytes(format, value.dtype(), poll.range.size()),
                     format,
                     value.priority(),
                     filed_at,
                     ShardTrace::now(),
                     {}};
  return answer;
}

void DataPlane::cancel(uint64_t id) {
  auto it = polls_.find(id);
  if (it == polls_.end()) return;
  // A call dropped after its shard went (the RPC system lets go of a connection's calls after
  // the host that served them, when a shard moves to another server): nothing to withdraw.
  if (alive_.expired()) return;
  endpoint_.shard.withdraw_poll(it->second);
  polls_.erase(it);
}

void DataPlane::refuse(uint64_t id, Error error) {
  endpoint_.shard.report_error(error);
  queue_error(id, std::move(error));
}

void DataPlane::queue_error(uint64_t id, Error error) {
  queue(Answer::refusal(id, std::move(error)));
}

void DataPlane::queue(Answer answer) {
  answers_.push(std::move(answer));
  if (sending_scheduled_) return;
  sending_scheduled_ = true;
  // At the end of the turn: the answers that become ready in one turn leave best first, and
  // share a write.
  tasks_.add(kj::evalLast([this] { send_waiting(); }));
}

void DataPlane::writable() {
  // At once: what waits became ready in earlier turns, or is queued for this one's end.
  if (!answers_.empty() && !sending_scheduled_) send_waiting();
}

void DataPlane::send_waiting() {
  sending_scheduled_ = false;
  std::vector<ShardTrace::Request> traced;
  std::vector<std::shared_ptr<const void>> narrowed;  // until written
  bool took = false;
  while (!answers_.empty() && writer_.has_room()) {
    Answer answer = answers_.pop();
    if (answer.kind == AnswerKind::value) narrow(answer);
    if (answer.traced) {
      answer.traced->format = answer.format;  // topk where it went as a delta
      answer.traced->bytes = answer.value.size();
      traced.push_back(*answer.traced);
    }
    writer_.take(answer);  // sees the value's own memory, if any (a call copies it)
    if (answer.narrowed) narrowed.push_back(std::move(answer.narrowed));
    took = true;
  }
  if (took) writer_.send();
  if (!narrowed.empty()) tasks_.add(writer_.written().then([narrowed = std::move(narrowed)] {}));
  if (has_room()) wake(room_);
  if (!traced.empty())
    tasks_.add(writer_.written().then([weak = weak_from_this(), traced = std::move(traced)] {
      if (auto plane = weak.lock())
        for (const ShardTrace::Request& r : traced) plane->record(r);
    }));
  if (answers_.empty() && drained_.get() != nullptr)
    tasks_.add(writer_.written().then([weak = weak_from_this()] {
      if (auto plane = weak.lock()) wake(plane->drained_);
    }));
}

kj::Promise<void> DataPlane::drained() {
  if (answers_.empty() && !sending_scheduled_) return writer_.written();
  auto paf = kj::newPromiseAndFulfiller<void>();
  drained_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

bool DataPlane::has_room() const {
  return answers_.size() < limits().max_waiting_polls;
}

kj::Maybe<kj::Promise<void>> DataPlane::wait_for_room() {
  if (has_room()) return nullptr;
  auto paf = kj::newPromiseAndFulfiller<void>();
  room_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void DataPlane::wake(kj::Own<kj::PromiseFulfiller<void>>& waiter) {
  if (waiter.get() != nullptr) waiter->fulfill();
  waiter = nullptr;
}

void DataPlane::record(ShardTrace::Request request) {
  if (!tracing()) return;
  request.end = ShardTrace::now();
  endpoint_.trace->add(request);
}

void DataPlane::taskFailed(kj::Exception&& exception) {
  log_error("shard {}: worker {}'s answers: {}", endpoint_.id.value, worker_.value,
            exception.getDescription().cStr());
}

}  // namespace psched
