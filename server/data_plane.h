// SPDX-License-Identifier: Apache-2.0
// DataPlane: the shard's side of one worker's data path, written once for both front ends.
// A front end (Cap'n Proto calls, server/shard_service.h; the data stream,
// server/data_session.h) decodes a request and hands it here; the plane checks it, hands it to
// the VariableShard (apply, or accumulate for sync), files the poll that waits for the update,
// counts what the worker has in flight (back-pressure), orders the answers (AnswerQueue) and
// hands them to the front end's AnswerWriter, best first, as it has room. A feature of the data
// path (a wire format, a membership rule) goes here, never into a front end.
//
// Bad input is answered with an error naming what was wrong, and changes nothing. Lives on the
// shard's loop, with the shard and the front end's connection; made with make_shared (the
// shard's replies hold it weakly). Dropping it withdraws its waiting polls.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include <kj/async.h>

#include "server/answer_queue.h"
#include "server/shard_endpoint.h"

namespace psched {

enum class RequestKind : uint8_t {
  push,       ///< a gradient partition; answered by a receipt
  poll,       ///< the fresh value once a step's update is applied; answered by the value
  push_poll,  ///< push, then poll of its range; answered by the value only
  pull,       ///< the current value at once
  push_rows,  ///< a worker's step of a table's rows held by the shard; answered by a receipt
  pull_rows,  ///< rows of a table once a step's update of them is applied; answered by them
};

// One request of a worker's, as a front end decoded it.
struct Request {
  RequestKind kind = RequestKind::push;
  uint64_t id = 0;        // the front end's; unique among the worker's unanswered requests
  uint32_t variable = 0;  // or the table
  uint64_t step = 0;      // push, poll, push_poll, push_rows, pull_rows
  uint64_t offset = 0;    // in elements
  uint64_t count = 0;     // poll, pull: elements asked for
  DType dtype = DType::float32;
  WireFormat format = WireFormat::none;        // push, push_poll: of `gradient`
  WireFormat value_format = WireFormat::none;  // poll, push_poll, pull: of the value's answer
  // poll, push_poll: a delta poll's (delta.count > 0) version held and what it asks for
  // (actors/shard/value_deltas.h); its answer is a delta, or full values in value_format.
  DeltaAsk delta{};
  // push, push_poll: the gradient (in `format`), in the front end's memory; `keeps_gradient`
  // (optional) is held until the shard has taken it, else the front end keeps it until the request
  // is answered.
  std::span<const std::byte> gradient{};
  std::shared_ptr<const void> keeps_gradient{};
  // push_rows, pull_rows: the row ids, 8 little-endian bytes each, in the front end's memory
  // (kept as the gradient is).
  std::span<const std::byte> ids{};
  // When its first byte was read (for the trace); unset: when the plane got it.
  ShardTrace::TimePoint arrived{};
  // What the front end found wrong while decoding it (a dtype not on the wire, say): the plane
  // answers with it and does nothing else.
  std::optional<Error> refused{};
};

// Where a front end takes its answers.
class AnswerWriter {
 public:
  // Whether another answer may be taken now. False holds answers back in priority order
  // until the front end calls DataPlane::writable().
  virtual bool has_room() = 0;
  // Takes the next answer; its value's bytes may be read until written() resolves.
  virtual void take(Answer& answer) = 0;
  // The answers taken so far leave now (they are all the plane has room for this turn).
  virtual void send() = 0;
  // Resolves once every answer taken so far has left (at once where the front end cannot tell).
  virtual kj::Promise<void> written() = 0;

 protected:
  ~AnswerWriter() = default;
};

class DataPlane : public std::enable_shared_from_this<DataPlane>,
                  private kj::TaskSet::ErrorHandler {
 public:
  // Serves `worker` for `endpoint`'s shard (which outlives the plane), answering through
  // `writer` (which outlives it too).
  DataPlane(ShardEndpoint& endpoint, WorkerId worker, AnswerWriter& writer);
  ~DataPlane() noexcept;
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Takes one request; its answer (as its kind says, or an error) is queued for the writer.
  void serve(Request request);
  // Forgets the waiting poll or push_poll `id` unanswered; nothing when none waits.
  void cancel(uint64_t id);
  // Answers `id` with `error`, a refusal the front end found itself (counted for operators).
  void refuse(uint64_t id, Error error);

  // Whether the front end may read more requests: fewer answers wait than polls may. (A push
  // holds no room: the shard, on the plane's loop, takes it before serve() returns, and the
  // front end's buffer for its gradient is free again; except a sync push of rows for the step
  // after the one under way, which the shard holds, counted among the polls, until it takes it.)
  bool has_room() const;
  // Null when there is room; else resolves when there is.
  kj::Maybe<kj::Promise<void>> wait_for_room();
  // Resolves when every answer queued so far has left.
  kj::Promise<void> drained();
  // The writer has room again: answers that wait since an earlier turn go out now.
  void writable();
  // Polls waiting for their update (the limit is limits.max_waiting_polls).
  size_t waiting_polls() const { return polls_.size(); }

 private:
  const LimitsConfig& limits() const { return endpoint_.config.limits; }
  // A push, or a push_poll: one entry into the shard either way.
  void push(const Request& request, bool then_poll);
  // The shard's receipt of `push` (`request`'s): queues its refusal, or counts and traces it
  // and, for a plain push, queues its receipt. Holds `widened`, the gradient decoded, until the
  // shard has taken it.
  VariableShard::Receipt receipt_of(const Request& request, const Push& push, bool then_poll,
                                    std::shared_ptr<AlignedBuffer> widened);
  // The gradient of a compressed push decoded into its dtype, in a buffer of its own; throws
  // Error naming what is wrong when it does not decode, is over the message limit decoded, or
  // holds an infinity or a NaN.
  std::shared_ptr<AlignedBuffer> widen(const Request& request) const;
  // `answer`'s value narrowed to its format, or a delta poll's answered, as it leaves; counts
  // its bytes.
  void narrow(Answer& answer);
  // A delta poll's answer: a delta in place of the value (true), or its version for the full
  // values.
  bool answer_delta(Answer& answer);
  void poll(const Request& request);
  void pull(const Request& request);
  void push_rows(const Request& request);
  void pull_rows(const Request& request);
  // The receipt of a push of rows: counted, or its refusal queued. Holds what the push
  // borrows (`held`) until the shard has taken it.
  VariableShard::Receipt rows_receipt(const Request& request, uint64_t raw,
                                      std::shared_ptr<const void> held);
  // What answers the pull of rows `id` with them in `format`, or its refusal; holds `ids`.
  VariableShard::ValueReply rows_reply(uint64_t id, WireFormat format,
                                       std::shared_ptr<const std::vector<uint64_t>> ids);
  // Throws unless a poll `id` may wait now.
  void check_new_poll(uint64_t id) const;
  // A ticket for the new poll `id`, which waits from now on.
  PollTicket new_poll(uint64_t id);
  // What answers poll `id` (`poll`) with its value in `format` (a delta where `delta` asks
  // for one), or its refusal.
  VariableShard::ValueReply value_reply(uint64_t id, const Poll& poll, WireFormat format,
                                        const DeltaAsk& delta);
  // The answer of `value`: its bytes where the shard keeps them (FreshValue::in_place), read as
  // the answer leaves; or, where the shard lends none (rows, a serving shard's values), a copy
  // the answer holds.
  Answer fresh_answer(uint64_t id, const FreshValue& value, WireFormat format) const;
  Answer value_answer(uint64_t id, const Poll& poll, WireFormat format, const DeltaAsk& delta,
                      const FreshValue& value, ShardTrace::TimePoint filed_at) const;
  void queue(Answer answer);
  void queue_error(uint64_t id, Error error);
  // Hands the best answers to the writer while it has room (at the end of a turn).
  void send_waiting();
  static void wake(kj::Own<kj::PromiseFulfiller<void>>& waiter);

  bool tracing() const { return endpoint_.trace != nullptr; }
  // Now, when tracing; else a time nobody reads (and no clock read).
  ShardTrace::TimePoint trace_time() const {
    return tracing() ? ShardTrace::now() : ShardTrace::TimePoint{};
  }
  // Adds `request`, ending now, to the trace (when tracing).
  void record(ShardTrace::Request request);

  void taskFailed(kj::Exception&& exception) override;

  ShardEndpoint& endpoint_;
  std::weak_ptr<bool> alive_;  // the endpoint's
  WorkerId worker_;
  AnswerWriter& writer_;
  std::unordered_map<uint64_t, PollTicket> polls_;  // waiting, by request id
  uint64_t receipts_waiting_ = 0;  // pushes of rows the shard holds (sync), counted as polls
  AnswerQueue answers_;
  bool sending_scheduled_ = false;  // a send_waiting is queued for the end of the turn
  kj::Own<kj::PromiseFulfiller<void>> room_, drained_;
  kj::TaskSet tasks_;
};

}  // namespace psched
