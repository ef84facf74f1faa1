// SPDX-License-Identifier: Apache-2.0
#include "server/data_session.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/kj_error.h"
#include "common/wall_clock.h"
#include "net/data_frame.h"
#include "net/rpc_connection.h"
#include "net/stream_reader.h"

namespace psched {
namespace {

// Answers go out about this many bytes to a write; a better value ready meanwhile waits for no
// more than that.
constexpr size_t kBatchBytes = 256 * 1024;
// Values below this are copied into the write's buffer; larger ones leave from the variable.
constexpr size_t kCopiedValueBytes = 64 * 1024;
// Receipts and errors go before every value: a receipt frees the worker's credit.
constexpr int64_t kFirst = INT64_MIN;

std::span<const std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

// One write's bytes: headers and small bodies copied into one buffer, large values referenced.
// The session keeps one and clears it for each write, so its memory is reused.
class Batch {
 public:
  size_t bytes() const { return bytes_; }
  void clear() {
    buffer_.clear();
    pieces_.clear();
    cut_at_ = bytes_ = 0;
  }
  void copy(std::span<const std::byte> bytes) {
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    bytes_ += bytes.size();
  }
  void reference(std::span<const std::byte> bytes) {
    cut();
    pieces_.push_back({bytes.data(), 0, bytes.size()});
    bytes_ += bytes.size();
  }
  // The pieces to write, in order; valid until the next clear().
  kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces() {
    cut();
    out_.clear();
    for (const Piece& p : pieces_) {
      const std::byte* at = p.referenced ? p.referenced : buffer_.data() + p.offset;
      out_.emplace_back(reinterpret_cast<const kj::byte*>(at), p.size);
    }
    return {out_.data(), out_.size()};
  }

 private:
  struct Piece {
    const std::byte* referenced;  // null: bytes at `offset` in buffer_
    size_t offset;
    size_t size;
  };
  // Ends the copied piece being built, if any.
  void cut() {
    if (buffer_.size() > cut_at_) pieces_.push_back({nullptr, cut_at_, buffer_.size() - cut_at_});
    cut_at_ = buffer_.size();
  }
  std::vector<std::byte> buffer_;
  size_t cut_at_ = 0;
  size_t bytes_ = 0;
  std::vector<Piece> pieces_;
  std::vector<kj::ArrayPtr<const kj::byte>> out_;  // pieces()
};

}  // namespace

class DataSession::Core : public std::enable_shared_from_this<Core>,
                          private kj::TaskSet::ErrorHandler {
 public:
  Core(ShardEndpoint& endpoint, WorkerId worker, kj::Own<kj::AsyncIoStream> stream,
       kj::Timer* timer, bool plain_socket)
      : endpoint_(endpoint),
        alive_(endpoint.alive),
        worker_(worker),
        stream_(without_nagle(kj::mv(stream))),
        reader_(*stream_, StreamReader::kBufferBytes, plain_socket),
        timer_(timer),
        writes_(*this) {}

  ~Core() noexcept(false) {
    if (!alive_.lock()) return;
    for (auto& [id, ticket] : polls_) endpoint_.shard.withdraw_poll(ticket);
  }

  kj::Promise<void> run() {
    auto broken = kj::newPromiseAndFulfiller<void>();
    broken_ = kj::mv(broken.fulfiller);
    auto served = read_frames().exclusiveJoin(kj::mv(broken.promise));
    if (!timer_) return served;
    return served.exclusiveJoin(watch_for_stalls(reader_.received(), timer_->now()));
  }

 private:
  struct Answer {
    int64_t priority;
    uint64_t sequence;
    FrameHeaderBytes header;
    std::span<const std::byte> value;           // in the variable's memory
    std::string text;                           // an error's
    std::optional<ShardTrace::Request> traced;  // a value's, when tracing
  };
  // Heap order: true when `a` goes after `b`.
  static bool later(const Answer& a, const Answer& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.sequence > b.sequence;
  }

  const LimitsConfig& limits() const { return endpoint_.config.limits; }

  // Reads and serves frames until the worker closes the stream: those already buffered at once,
  // one after the other, then waits for more.
  kj::Promise<void> read_frames() {
    while (has_room() && reader_.buffered() >= header_.size()) {
      reader_.take(header_.data(), header_.size());
      KJ_IF_MAYBE (finishing, serve_frame()) {
        return finishing->then([this] { return read_frames(); });
      }
    }
    if (!has_room()) return wait_for_room().then([this] { return read_frames(); });
    waiting_for_ = Wait::header;
    return reader_.fill(header_.size()).then([this](bool filled) -> kj::Promise<void> {
      waiting_for_ = Wait::nothing;
      if (filled) return read_frames();
      if (reader_.buffered() == 0) return kj::READY_NOW;  // closed between frames
      return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                           kj::str("the worker closed the data stream inside a frame"));
    });
  }

  // Serves the frame whose header was just read; null when done, else what finishes it (the
  // rest of its body to read, or the stream to close).
  kj::Maybe<kj::Promise<void>> serve_frame() {
    std::string why;
    std::optional<DataRequest> decoded = decode_request(header_, why);
    if (!decoded)
      return close_with(
          0, Error(ErrorCode::invalid_argument, fmt::format("data stream closed: {}", why)));
    const DataRequest r = *decoded;
    if (r.body_bytes() > limits().max_message_bytes)
      return close_with(r.id, Error(ErrorCode::message_too_large,
                                    fmt::format("push to variable id {} rejected: {} bytes of data "
                                                "exceed the message limit of {} bytes "
                                                "(limits.max_message_bytes); data stream closed",
                                                r.variable, r.size, limits().max_message_bytes)));
    switch (r.kind) {
      case RequestKind::push:
      case RequestKind::push_poll: {
        auto data = endpoint_.receive_buffers->take(r.size);
        ShardTrace::TimePoint header_at = trace_time();
        KJ_IF_MAYBE (rest, reader_.read_or_wait(data->data(), r.size)) {
          waiting_for_ = Wait::body;
          return rest->then([this, r, data, header_at] {
            waiting_for_ = Wait::nothing;
            push(r, data, header_at);
          });
        }
        push(r, data, header_at);
        return nullptr;
      }
      case RequestKind::poll:
        poll(r);
        break;
      case RequestKind::cancel:
        forget_poll(r.id);
        break;
    }
    return nullptr;
  }

  // `header_at`: when the frame's header was read (for the trace).
  void push(const DataRequest& r, std::shared_ptr<AlignedBuffer> data,
            ShardTrace::TimePoint header_at) {
    const bool then_poll = r.kind == RequestKind::push_poll;
    PushArgs args;
    try {
      args = check_push(limits(), r.variable, r.step, r.offset, r.dtype, data->bytes());
      if (then_poll) check_new_poll(r.id);
    } catch (...) {
      return refuse(r.id, std::current_exception());
    }
    unreceipted_bytes_ += data->size();
    auto refused = std::make_shared<bool>(false);
    ShardTrace::Request traced{
        ShardTrace::Kind::push, worker_,     args.variable, args.step,    args.range,
        data->size(),           Priority(0), header_at,     trace_time(), {}};
    endpoint_.shard.push(
        worker_, args.variable, args.step, args.range, args.dtype, args.data,
        [weak = weak_from_this(), id = r.id, then_poll, data, refused,
         traced](std::exception_ptr error) {
          *refused = error != nullptr;
          auto core = weak.lock();
          if (!core) return;
          core->receipted(data->size());
          if (error) {
            if (then_poll) core->forget_poll(id);
            return core->queue_error(id, error);
          }
          core->record(traced);
          if (!then_poll)
            core->queue({kFirst, 0, encode(DataAnswer{AnswerKind::receipt, id}), {}, {}, {}});
        });
    // Filed behind the push; withdrawn if the push is refused later (the apply pool's answer).
    if (then_poll && !*refused) file_poll(r.id, args.variable, args.step, args.range);
  }

  void poll(const DataRequest& r) {
    ElementRange range;
    try {
      range = checked_range("poll", r.offset, r.size);
      check_new_poll(r.id);
    } catch (...) {
      return refuse(r.id, std::current_exception());
    }
    file_poll(r.id, VariableId(r.variable), Step(r.step), range);
  }

  void check_new_poll(uint64_t id) const {
    check_poll_room(limits(), polls_.size());
    if (polls_.contains(id))
      fail(ErrorCode::invalid_argument, "request id {} is already waiting on this data stream", id);
  }

  void file_poll(uint64_t id, VariableId variable, Step step, ElementRange range) {
    PollTicket ticket(endpoint_.next_poll_ticket++);
    polls_.emplace(id, ticket);
    endpoint_.shard.poll(
        worker_, variable, step, range, ticket,
        [weak = weak_from_this(), id, variable, step, range, filed_at = trace_time()](
            std::exception_ptr error, const FreshValue* value) {
          auto core = weak.lock();
          if (!core) return;
          core->polls_.erase(id);
          if (error) return core->queue_error(id, error);
          std::span<const std::byte> bytes = value->in_place();
          DataAnswer answer{AnswerKind::value, id, value->step().value, wall_clock_ns(),
                            bytes.size()};
          std::optional<ShardTrace::Request> traced;
          if (core->tracing())
            traced = {
                ShardTrace::Kind::poll, core->worker_, variable,          step, range, bytes.size(),
                value->priority(),      filed_at,      ShardTrace::now(), {}};
          core->queue({value->priority().value, 0, encode(answer), bytes, {}, traced});
        });
  }

  // Forgets the waiting poll `id` (cancelled, or its push refused); nothing if none waits.
  void forget_poll(uint64_t id) {
    auto it = polls_.find(id);
    if (it == polls_.end()) return;
    endpoint_.shard.withdraw_poll(it->second);
    polls_.erase(it);
  }

  // Answers `id` with `error`, which the shard never saw (it counts it for the operator view).
  void refuse(uint64_t id, std::exception_ptr error) {
    endpoint_.shard.report_error(error);
    queue_error(id, error);
  }

  void queue_error(uint64_t id, std::exception_ptr error) {
    std::string text = to_kj_exception(error).getDescription().cStr();
    DataAnswer answer{AnswerKind::error, id, 0, 0, text.size()};
    queue({kFirst, 0, encode(answer), {}, std::move(text), {}});
  }

  // Answers with `error`, then ends the session: the frame cannot be skipped.
  kj::Promise<void> close_with(uint64_t id, Error error) {
    auto e = std::make_exception_ptr(std::move(error));
    refuse(id, e);
    return drained().then([e]() -> kj::Promise<void> { return to_kj_exception(e); });
  }

  void queue(Answer answer) {
    answer.sequence = next_sequence_++;
    answers_.push_back(std::move(answer));
    std::push_heap(answers_.begin(), answers_.end(), later);
    if (writing_) return;
    writing_ = true;
    // At the end of the turn, so that the answers of one turn share a write.
    writes_.add(kj::evalLast([this] { return write_batch(); }));
  }

  kj::Promise<void> write_batch() {
    if (answers_.empty()) {
      writing_ = false;
      wake(drained_);
      wake(room_);
      return kj::READY_NOW;
    }
    batch_.clear();
    std::vector<ShardTrace::Request> traced;  // this write's values, when tracing
    while (!answers_.empty() && batch_.bytes() < kBatchBytes) {
      std::pop_heap(answers_.begin(), answers_.end(), later);
      Answer a = std::move(answers_.back());
      answers_.pop_back();
      if (a.traced) traced.push_back(*a.traced);
      batch_.copy(a.header);
      if (!a.text.empty()) batch_.copy(bytes_of(a.text));
      if (a.value.size() < kCopiedValueBytes)
        batch_.copy(a.value);
      else
        batch_.reference(a.value);
    }
    wake(room_);
    return stream_->write(batch_.pieces()).then([this, traced = std::move(traced)] {
      for (const ShardTrace::Request& r : traced) record(r);
      return write_batch();
    });
  }

  // Resolves when no answer waits to be written.
  kj::Promise<void> drained() {
    if (!writing_) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    drained_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  // Resolves when the worker may send more: its unreceipted gradients hold less than twice
  // the message limit, and fewer answers wait than polls may.
  kj::Promise<void> wait_for_room() {
    if (has_room()) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    room_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  bool has_room() const {
    return unreceipted_bytes_ <= 2 * limits().max_message_bytes &&
           answers_.size() < limits().max_waiting_polls;
  }
  void receipted(uint64_t bytes) {
    unreceipted_bytes_ -= bytes;
    if (has_room()) wake(room_);
  }
  static void wake(kj::Own<kj::PromiseFulfiller<void>>& waiter) {
    if (waiter.get() != nullptr) waiter->fulfill();
    waiter = nullptr;
  }

  // Fails with DISCONNECTED once the worker has sent nothing for limits.stall_timeout_seconds
  // while a frame of it is begun. It looks an eighth of the timeout apart, so no single read
  // pays for a timer, and a stall is dropped at most a quarter of the timeout late. `seen`:
  // the bytes received at `quiet_since`, the last look that found no frame begun or new bytes.
  kj::Promise<void> watch_for_stalls(uint64_t seen, kj::TimePoint quiet_since) {
    uint64_t seconds = limits().stall_timeout_seconds;
    kj::Duration timeout = seconds * kj::SECONDS;
    return timer_->afterDelay(timeout / 8).then([this, seen, quiet_since, seconds, timeout] {
      kj::TimePoint now = timer_->now();
      if (!inside_frame() || reader_.received() != seen)
        return watch_for_stalls(reader_.received(), now);
      if (now - quiet_since < timeout) return watch_for_stalls(seen, quiet_since);
      return kj::Promise<void>(
          kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                        kj::str("data stream silent for ", seconds,
                                " s inside a frame (limits.stall_timeout_seconds)")));
    });
  }
  // Whether the session waits for the rest of a begun frame.
  bool inside_frame() const {
    return waiting_for_ == Wait::body || (waiting_for_ == Wait::header && reader_.buffered() > 0);
  }

  bool tracing() const { return endpoint_.trace != nullptr; }
  // Now, when tracing; else a time nobody reads (and no clock read).
  ShardTrace::TimePoint trace_time() const {
    return tracing() ? ShardTrace::now() : ShardTrace::TimePoint{};
  }
  // Adds `request`, ending now, to the trace (when tracing).
  void record(ShardTrace::Request request) {
    if (!tracing()) return;
    request.end = ShardTrace::now();
    endpoint_.trace->add(request);
  }

  void taskFailed(kj::Exception&& exception) override {
    if (broken_.get() != nullptr) broken_->reject(kj::mv(exception));
  }

  ShardEndpoint& endpoint_;
  std::weak_ptr<bool> alive_;  // the endpoint's
  WorkerId worker_;
  kj::Own<kj::AsyncIoStream> stream_;
  StreamReader reader_;  // of stream_
  kj::Timer* timer_;
  enum class Wait { nothing, header, body } waiting_for_ = Wait::nothing;  // from the worker
  FrameHeaderBytes header_{};                                              // the frame being read
  std::unordered_map<uint64_t, PollTicket> polls_;                         // waiting, by request id
  uint64_t unreceipted_bytes_ = 0;
  std::vector<Answer> answers_;  // a heap, best on top
  uint64_t next_sequence_ = 0;
  bool writing_ = false;  // a write_batch is scheduled or running
  Batch batch_;           // what the running write_batch writes
  kj::Own<kj::PromiseFulfiller<void>> room_, drained_, broken_;
  kj::TaskSet writes_;
};

DataSession::DataSession(ShardEndpoint& endpoint, WorkerId worker,
                         kj::Own<kj::AsyncIoStream> stream, kj::Timer* timer, bool plain_socket)
    : core_(std::make_shared<Core>(endpoint, worker, kj::mv(stream), timer, plain_socket)) {}

DataSession::~DataSession() = default;

kj::Promise<void> DataSession::run() {
  return core_->run();
}

}  // namespace psched
