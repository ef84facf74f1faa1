// SPDX-License-Identifier: Apache-2.0
#include "link/data_channel.h"

#include <cstring>
#include <optional>
#include <string>

#include "common/kj_error.h"
#include "compression/codec.h"
#include "net/rpc_connection.h"

namespace psched {
namespace {

Error lost(std::string_view why) {
  return Error(ErrorCode::disconnected, fmt::format("data stream to the shard lost: {}", why));
}

}  // namespace

kj::Promise<kj::Own<DataChannel>> DataChannel::open(kj::Own<kj::AsyncIoStream> stream,
                                                    kj::ArrayPtr<const kj::byte> key,
                                                    uint64_t max_answer_bytes, bool plain_socket) {
  auto preface = kj::heapArray<kj::byte>(kDataPreface.size() + key.size());
  std::memcpy(preface.begin(), kDataPreface.data(), kDataPreface.size());
  std::memcpy(preface.begin() + kDataPreface.size(), key.begin(), key.size());
  auto channel = kj::heap<DataChannel>(kj::mv(stream), max_answer_bytes, plain_socket);
  DataChannel& opening = *channel;
  return opening.stream_->write(preface.begin(), preface.size())
      .attach(kj::mv(preface))
      .then([&opening] { return opening.handshake(); })
      .then([channel = kj::mv(channel)]() mutable { return kj::mv(channel); });
}

DataChannel::DataChannel(kj::Own<kj::AsyncIoStream> stream, uint64_t max_answer_bytes,
                         bool plain_socket)
    : stream_(without_nagle(kj::mv(stream))),
      reader_(*stream_, plain_socket),
      writer_(*stream_, [this](kj::Exception e) { fail_all(lost(e.getDescription().cStr())); }),
      max_answer_bytes_(max_answer_bytes),
      tasks_(*this) {}

DataChannel::~DataChannel() noexcept = default;

kj::Promise<void> DataChannel::handshake() {
  auto header = kj::heap<FrameHeaderBytes>();
  auto read = reader_.body().read(header->data(), header->size());
  return read
      .then([this, &bytes = *header]() -> kj::Promise<void> {
        std::optional<AnswerHeader> answer = decode_answer(bytes);
        if (answer && answer->kind == wire::AnswerKind::READY && answer->body_bytes == 0) {
          tasks_.add(reader_.run([this](const FrameHeaderBytes& h) { return take_answer(h); })
                         .then([this] { fail_all(lost("the shard closed it")); }));
          return kj::READY_NOW;
        }
        if (!answer || answer->kind != wire::AnswerKind::ERROR ||
            answer->body_bytes > max_answer_bytes_)
          return to_kj_exception(
              lost("the shard's answer to the preface is no data stream answer"));
        auto text = kj::heapArray<char>(answer->body_bytes);
        auto read = reader_.body().read(text.begin(), text.size());
        return read.then([text = kj::mv(text)]() -> kj::Promise<void> {
          return to_kj_exception(from_description({text.begin(), text.size()}));
        });
      })
      .attach(kj::mv(header));
}

kj::Promise<void> DataChannel::push(const PartitionRequest& part) {
  return send(wire::RequestKind::PUSH, part).ignoreResult();
}

kj::Promise<Landed> DataChannel::poll(const PartitionRequest& part) {
  return send(wire::RequestKind::POLL, part);
}

kj::Promise<Landed> DataChannel::push_poll(const PartitionRequest& part) {
  return send(wire::RequestKind::PUSH_POLL, part);
}

kj::Promise<Landed> DataChannel::send(wire::RequestKind kind, const PartitionRequest& part) {
  if (broken_) return to_kj_exception(*broken_);
  bool pushes = kind != wire::RequestKind::POLL;
  RequestHeader header{
      .kind = kind,
      .dtype = part.dtype,
      .variable = part.variable.value,
      .id = next_id_++,
      .step = part.step.value,
      .offset = part.range.begin,
      .body_bytes = pushes ? part.gradient.size() : 0,
      .count = pushes ? 0 : part.range.size(),
      .format = pushes ? part.format : WireFormat::none,
      .value_format = kind == wire::RequestKind::PUSH ? WireFormat::none : part.value_format};
  if (kind != wire::RequestKind::PUSH && part.delta.version != nullptr) {
    header.base_version = part.delta.base();
    header.delta_count = part.delta.count;
    header.delta_ring = part.delta.ring;
    header.delta_refresh = part.delta.refresh;
  }
  auto answered = kj::newPromiseAndFulfiller<Landed>();
  waiting_.emplace(header.id, Waiting{kj::mv(answered.fulfiller), kind, part.landing()});
  // The gradient stays in the trainer's memory until the request is answered: no copy.
  writer_.add_referenced(encode(header), pushes ? part.gradient : std::span<const std::byte>());
  writer_.flush_at_end_of_turn();  // the requests of one turn share a write
  return answered.promise.attach(kj::defer([this, id = header.id] { abandon(id); }));
}

kj::Promise<void> DataChannel::push_rows(const RowsRequest& rows) {
  return send_rows(wire::RequestKind::PUSH_ROWS, rows).ignoreResult();
}

kj::Promise<Landed> DataChannel::pull_rows(const RowsRequest& rows) {
  return send_rows(wire::RequestKind::PULL_ROWS, rows);
}

kj::Promise<Landed> DataChannel::send_rows(wire::RequestKind kind, const RowsRequest& rows) {
  if (broken_) return to_kj_exception(*broken_);
  const bool push = kind == wire::RequestKind::PUSH_ROWS;
  const std::span<const std::byte> ids = std::as_bytes(rows.ids);
  const std::span<const std::byte> gradient = push ? rows.gradient : std::span<const std::byte>();
  RequestHeader header{.kind = kind,
                       .dtype = rows.dtype,
                       .variable = rows.table.value,
                       .id = next_id_++,
                       .step = rows.step.value,
                       .offset = rows.ids.size(),
                       .body_bytes = ids.size() + gradient.size(),
                       .format = push ? rows.format : WireFormat::none,
                       .value_format = push ? WireFormat::none : rows.value_format};
  auto answered = kj::newPromiseAndFulfiller<Landed>();
  // A pull is withdrawn as a poll is when dropped; a push is not (as PUSH).
  waiting_.emplace(header.id, Waiting{kj::mv(answered.fulfiller),
                                      push ? wire::RequestKind::PUSH : kind, rows.landing()});
  // The ids and rows stay in the worker's memory until the request is answered: no copy.
  writer_.add_referenced(encode(header), {ids, gradient});
  writer_.flush_at_end_of_turn();
  return answered.promise.attach(kj::defer([this, id = header.id] { abandon(id); }));
}

void DataChannel::abandon(uint64_t id) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return;  // answered
  bool poll = it->second.kind != wire::RequestKind::PUSH;
  waiting_.erase(it);
  if (poll && !broken_) {
    writer_.add(encode(RequestHeader{.kind = wire::RequestKind::CANCEL, .id = id}));
    writer_.flush_at_end_of_turn();
  }
}

kj::Maybe<kj::Promise<void>> DataChannel::take_answer(const FrameHeaderBytes& bytes) {
  std::optional<AnswerHeader> answer = decode_answer(bytes);
  if (!answer) return kj::Promise<void>(to_kj_exception(lost("an answer of unknown kind")));
  if (answer->body_bytes > max_answer_bytes_)
    return kj::Promise<void>(to_kj_exception(lost(fmt::format(
        "an answer of {} bytes, over the limit of {}", answer->body_bytes, max_answer_bytes_))));
  switch (answer->kind) {
    case wire::AnswerKind::RECEIPT:
      settle(answer->id, Landed{});
      return discard(answer->body_bytes);
    case wire::AnswerKind::VALUE:
      return take_value(*answer);
    case wire::AnswerKind::ERROR:
      return take_error(*answer);
    case wire::AnswerKind::READY:
    case wire::AnswerKind::UNKNOWN:
      break;
  }
  return kj::Promise<void>(to_kj_exception(lost("a second ready answer")));
}

kj::Maybe<kj::Promise<void>> DataChannel::take_value(const AnswerHeader& answer) {
  auto it = waiting_.find(answer.id);
  if (it == waiting_.end()) return discard(answer.body_bytes);  // cancelled
  const Waiting& waiting = it->second;
  const Landing& landing = waiting.landing;
  const bool delta = answer.format == WireFormat::topk;
  const size_t expected = waiting.kind == wire::RequestKind::PUSH ? 0
                          : delta ? encoded_bytes(WireFormat::topk, landing.dtype, landing.elements)
                                  : landing.wire_bytes();  // a delta: at most every element
  std::optional<Error> wrong;
  if (waiting.kind != wire::RequestKind::PUSH && !landing.takes(answer.format))
    wrong = Error(ErrorCode::invalid_argument,
                  fmt::format("shard answered in {} where {} was asked for",
                              to_string(answer.format), to_string(landing.format)));
  else if (waiting.kind == wire::RequestKind::PUSH ||
           (delta ? answer.body_bytes > expected : answer.body_bytes != expected))
    wrong = Error(
        ErrorCode::shape_mismatch,
        fmt::format("shard answered {} bytes where {} were expected", answer.body_bytes, expected));
  if (wrong) {
    settle(answer.id, *wrong);
    return discard(answer.body_bytes);
  }
  if (delta || landing.format != WireFormat::none) return take_narrowed(answer, landing);
  Landed value{answer.applied_at_ns};
  auto landed = [this, id = answer.id, value, version = landing.version,
                 answered = answer.version] {
    if (version != nullptr) *version = answered;
    settle(id, value);
  };
  if (!landing.rows_at.empty()) {
    KJ_IF_MAYBE (rest, read_rows(landing, 0)) {
      return rest->then(kj::mv(landed));
    }
    landed();
    return nullptr;
  }
  KJ_IF_MAYBE (rest, reader_.body().read_or_wait(landing.out, answer.body_bytes)) {
    return rest->then(kj::mv(landed));
  }
  landed();
  return nullptr;
}

kj::Maybe<kj::Promise<void>> DataChannel::read_rows(const Landing& landing, size_t k) {
  for (; k < landing.rows_at.size(); ++k)
    KJ_IF_MAYBE (rest, reader_.body().read_or_wait(landing.row_out(k), landing.row_bytes())) {
      return rest->then([this, landing, k]() -> kj::Promise<void> {
        KJ_IF_MAYBE (more, read_rows(landing, k + 1)) {
          return kj::mv(*more);
        }
        return kj::READY_NOW;
      });
    }
  return nullptr;
}

kj::Maybe<kj::Promise<void>> DataChannel::take_narrowed(const AnswerHeader& answer,
                                                        const Landing& landing) {
  auto body = kj::heapArray<std::byte>(answer.body_bytes);
  auto landed = [this, id = answer.id, landing, at = answer.applied_at_ns, format = answer.format,
                 version = answer.version](kj::ArrayPtr<const std::byte> body) {
    Result<> widened = landing.land({body.begin(), body.size()}, format, version);
    if (widened)
      settle(id, Landed{at});
    else
      settle(id, widened.error());
  };
  KJ_IF_MAYBE (rest, reader_.body().read_or_wait(body.begin(), body.size())) {
    return rest->then([landed, body = kj::mv(body)] { landed(body); });
  }
  landed(body);
  return nullptr;
}

kj::Maybe<kj::Promise<void>> DataChannel::take_error(const AnswerHeader& answer) {
  auto text = kj::heapArray<char>(answer.body_bytes);
  auto refused = [this, id = answer.id](kj::ArrayPtr<const char> text) {
    settle(id, from_description({text.begin(), text.size()}));
  };
  KJ_IF_MAYBE (rest, reader_.body().read_or_wait(text.begin(), text.size())) {
    return rest->then([refused, text = kj::mv(text)] { refused(text); });
  }
  refused(text);
  return nullptr;
}

void DataChannel::settle(uint64_t id, Result<Landed> outcome) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return;
  auto answer = kj::mv(it->second.answer);
  waiting_.erase(it);
  if (outcome)
    answer->fulfill(Landed(*outcome));
  else
    answer->reject(to_kj_exception(outcome.error()));
}

kj::Maybe<kj::Promise<void>> DataChannel::discard(uint64_t bytes) {
  if (bytes == 0) return nullptr;
  return reader_.body().skip(bytes);
}

void DataChannel::fail_all(Error why) {
  if (!broken_) broken_ = why;
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& [id, w] : waiting) w.answer->reject(to_kj_exception(why));
}

void DataChannel::taskFailed(kj::Exception&& exception) {
  Error error = from_kj_exception(exception);
  fail_all(error.code() == ErrorCode::disconnected ? error : lost(error.what()));
}

}  // namespace psched
