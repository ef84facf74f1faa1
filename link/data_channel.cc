// SPDX-License-Identifier: Apache-2.0
#include "link/data_channel.h"

#include <cstring>
#include <string>

#include "common/kj_error.h"
#include "net/rpc_connection.h"

namespace psched {
namespace {

// At most this many requests go in one write (below the kernel's IOV_MAX of pieces).
constexpr size_t kRequestsPerWrite = 256;

// The exception a shard's error answer ("[code] message") stands for, of the type its code's
// category gives (a lost shard is DISCONNECTED, so the caller reconnects).
kj::Exception answered_error(std::string_view text) {
  kj::Exception raw(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                    kj::heapString(text.data(), text.size()));
  return to_kj_exception(std::make_exception_ptr(from_kj_exception(raw)));
}

kj::Exception broken(std::string_view why) {
  return to_kj_exception(std::make_exception_ptr(
      Error(ErrorCode::disconnected, fmt::format("data stream to the shard lost: {}", why))));
}

kj::ArrayPtr<const kj::byte> piece(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()};
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
      reader_(*stream_, StreamReader::kBufferBytes, plain_socket),
      max_answer_bytes_(max_answer_bytes),
      tasks_(*this) {}

DataChannel::~DataChannel() noexcept = default;

kj::Promise<void> DataChannel::handshake() {
  return reader_.read(header_.data(), header_.size()).then([this]() -> kj::Promise<void> {
    std::optional<DataAnswer> answer = decode_answer(header_);
    if (answer && answer->kind == AnswerKind::ready && answer->body_bytes == 0) {
      tasks_.add(read_answers());
      return kj::READY_NOW;
    }
    if (!answer || answer->kind != AnswerKind::error || answer->body_bytes > max_answer_bytes_)
      return broken("the shard's answer to the preface is no data stream answer");
    auto text = kj::heapArray<char>(answer->body_bytes);
    auto read = reader_.read(text.begin(), text.size());
    return read.then([text = kj::mv(text)]() -> kj::Promise<void> {
      return answered_error({text.begin(), text.size()});
    });
  });
}

kj::Promise<int64_t> DataChannel::send(DataRequest request, std::span<const std::byte> body,
                                       std::byte* out, size_t out_bytes) {
  KJ_IF_MAYBE (e, broken_) {
    return kj::cp(*e);
  }
  request.id = next_id_++;
  auto answered = kj::newPromiseAndFulfiller<int64_t>();
  waiting_.emplace(request.id, Waiting{kj::mv(answered.fulfiller), request.kind, out, out_bytes});
  queue(encode(request), body);
  return answered.promise.attach(kj::defer([this, id = request.id] { abandon(id); }));
}

void DataChannel::abandon(uint64_t id) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return;  // answered
  bool poll = it->second.kind != RequestKind::push;
  waiting_.erase(it);
  if (poll && broken_ == nullptr) queue(encode(DataRequest{RequestKind::cancel, {}, 0, id}), {});
}

void DataChannel::queue(const FrameHeaderBytes& header, std::span<const std::byte> body) {
  queued_.push_back({header, body});
  if (writing_) return;
  writing_ = true;
  // At the end of the turn, so that the requests of one turn share a write.
  tasks_.add(kj::evalLast([this] { return write_queued(); }));
}

kj::Promise<void> DataChannel::write_queued() {
  if (queued_.empty() || broken_ != nullptr) {
    writing_ = false;
    return kj::READY_NOW;
  }
  size_t n = std::min(queued_.size(), kRequestsPerWrite);
  in_write_.assign(queued_.begin(), queued_.begin() + n);
  queued_.erase(queued_.begin(), queued_.begin() + n);
  pieces_.clear();
  for (const Outgoing& o : in_write_) {
    pieces_.push_back(piece(o.header));
    if (!o.body.empty()) pieces_.push_back(piece(o.body));
  }
  return stream_->write({pieces_.data(), pieces_.size()}).then([this] { return write_queued(); });
}

kj::Promise<void> DataChannel::read_answers() {
  while (reader_.buffered() >= header_.size()) {
    reader_.take(header_.data(), header_.size());
    std::optional<DataAnswer> answer = decode_answer(header_);
    if (!answer) return broken("an answer of unknown kind");
    KJ_IF_MAYBE (finishing, take_answer(*answer)) {
      return finishing->then([this] { return read_answers(); });
    }
  }
  return reader_.fill(header_.size()).then([this](bool filled) -> kj::Promise<void> {
    if (filled) return read_answers();
    return broken(reader_.buffered() == 0 ? "the shard closed it"
                                          : "the shard closed it inside an answer");
  });
}

kj::Maybe<kj::Promise<void>> DataChannel::take_answer(const DataAnswer& answer) {
  if (answer.body_bytes > max_answer_bytes_)
    return kj::Promise<void>(broken(fmt::format("an answer of {} bytes, over the limit of {}",
                                                answer.body_bytes, max_answer_bytes_)));
  switch (answer.kind) {
    case AnswerKind::receipt:
      if (auto settled = take_waiting(answer.id); settled.get() != nullptr) settled->fulfill(0);
      return discard(answer.body_bytes);
    case AnswerKind::value:
      return take_value(answer);
    case AnswerKind::error:
      return take_error(answer);
    case AnswerKind::ready:
      break;
  }
  return kj::Promise<void>(broken("a second ready answer"));
}

kj::Maybe<kj::Promise<void>> DataChannel::take_value(const DataAnswer& answer) {
  auto it = waiting_.find(answer.id);
  if (it == waiting_.end()) return discard(answer.body_bytes);  // cancelled
  Waiting& waiting = it->second;
  if (waiting.out == nullptr || waiting.out_bytes != answer.body_bytes) {
    size_t expected = waiting.out_bytes;
    take_waiting(answer.id)->reject(to_kj_exception(std::make_exception_ptr(
        Error(ErrorCode::shape_mismatch, fmt::format("shard answered {} bytes where {} were "
                                                     "expected",
                                                     answer.body_bytes, expected)))));
    return discard(answer.body_bytes);
  }
  auto settle = [this, id = answer.id, at_ns = answer.applied_at_ns] {
    if (auto settled = take_waiting(id); settled.get() != nullptr) settled->fulfill(kj::cp(at_ns));
  };
  KJ_IF_MAYBE (rest, reader_.read_or_wait(waiting.out, answer.body_bytes)) {
    return rest->then(kj::mv(settle));
  }
  settle();
  return nullptr;
}

kj::Maybe<kj::Promise<void>> DataChannel::take_error(const DataAnswer& answer) {
  auto text = kj::heapArray<char>(answer.body_bytes);
  auto settle = [this, id = answer.id](kj::ArrayPtr<const char> text) {
    if (auto settled = take_waiting(id); settled.get() != nullptr)
      settled->reject(answered_error({text.begin(), text.size()}));
  };
  KJ_IF_MAYBE (rest, reader_.read_or_wait(text.begin(), text.size())) {
    return rest->then([settle, text = kj::mv(text)] { settle(text); });
  }
  settle(text);
  return nullptr;
}

kj::Own<kj::PromiseFulfiller<int64_t>> DataChannel::take_waiting(uint64_t id) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return {};
  auto answer = kj::mv(it->second.answer);
  waiting_.erase(it);
  return answer;
}

kj::Maybe<kj::Promise<void>> DataChannel::discard(uint64_t bytes) {
  if (bytes == 0) return nullptr;
  return reader_.skip(bytes);
}

void DataChannel::fail_all(kj::Exception why) {
  if (broken_ == nullptr) broken_ = kj::cp(why);
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& [id, w] : waiting) w.answer->reject(kj::cp(why));
}

void DataChannel::taskFailed(kj::Exception&& exception) {
  if (exception.getType() == kj::Exception::Type::DISCONNECTED &&
      from_kj_exception(exception).code() == ErrorCode::disconnected)
    return fail_all(kj::mv(exception));
  fail_all(broken(exception.getDescription().cStr()));
}

}  // namespace psched
