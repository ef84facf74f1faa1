// SPDX-License-Identifier: Apache-2.0
#include "server/data_session.h"

#include "common/kj_error.h"
#include "net/rpc_connection.h"

namespace psched {
namespace {

std::span<const std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

DeltaAsk delta_ask(const RequestHeader& r) {
  return {r.base_version, r.delta_count, r.delta_ring, r.delta_refresh};
}

}  // namespace

DataSession::DataSession(ShardEndpoint& endpoint, WorkerId worker,
                         kj::Own<kj::AsyncIoStream> stream, kj::Timer* timer, bool plain_socket)
    : endpoint_(endpoint),
      timer_(timer),
      stream_(without_nagle(kj::mv(stream))),
      reader_(*stream_, plain_socket),
      writer_(*stream_,
              [this](kj::Exception e) {
                if (broken_.get() != nullptr) broken_->reject(kj::mv(e));
              }),
      plane_(std::make_shared<DataPlane>(endpoint, worker, static_cast<AnswerWriter&>(*this))) {
  writer_.on_written([this] { plane_->writable(); });
}

kj::Promise<void> DataSession::run() {
  auto broken = kj::newPromiseAndFulfiller<void>();
  broken_ = kj::mv(broken.fulfiller);
  auto served = reader_
                    .run([this](const FrameHeaderBytes& header) { return serve_frame(header); },
                         [this] { return plane_->wait_for_room(); })
                    .exclusiveJoin(kj::mv(broken.promise));
  if (!timer_) return served;
  uint64_t seconds = endpoint_.config.limits.stall_timeout_seconds;
  return served.exclusiveJoin(
      reader_.stalls(*timer_, seconds * kj::SECONDS, "limits.stall_timeout_seconds"));
}

kj::Maybe<kj::Promise<void>> DataSession::serve_frame(const FrameHeaderBytes& bytes) {
  std::string why;
  std::optional<RequestHeader> decoded = decode_request(bytes, why);
  if (!decoded)
    return close_with(
        0, Error(ErrorCode::invalid_argument, fmt::format("data stream closed: {}", why)));
  const RequestHeader& r = *decoded;
  uint64_t limit = endpoint_.config.limits.max_message_bytes;
  if (r.body_bytes > limit)
    return close_with(r.id, Error(ErrorCode::message_too_large,
                                  fmt::format("push to variable id {} rejected: {} bytes of data "
                                              "exceed the message limit of {} bytes "
                                              "(limits.max_message_bytes); data stream closed",
                                              r.variable, r.body_bytes, limit)));
  switch (r.kind) {
    case wire::RequestKind::PUSH:
    case wire::RequestKind::PUSH_POLL:
      return read_push(r);
    case wire::RequestKind::POLL:
      plane_->serve({.kind = RequestKind::poll,
                     .id = r.id,
                     .variable = r.variable,
                     .step = r.step,
                     .offset = r.offset,
                     .count = r.count,
                     .value_format = r.value_format,
                     .delta = delta_ask(r)});
      return nullptr;
    case wire::RequestKind::CANCEL:
      plane_->cancel(r.id);
      return nullptr;
    case wire::RequestKind::PUSH_ROWS:
    case wire::RequestKind::PULL_ROWS:
      return read_rows(r);
    case wire::RequestKind::UNKNOWN:
      break;
  }
  return nullptr;  // decode_request refuses unknown kinds
}

kj::Maybe<kj::Promise<void>> DataSession::read_push(const RequestHeader& r) {
  auto data = endpoint_.receive_buffers->take(r.body_bytes);
  Request push{
      .kind = r.kind == wire::RequestKind::PUSH ? RequestKind::push : RequestKind::push_poll,
      .id = r.id,
      .variable = r.variable,
      .step = r.step,
      .offset = r.offset,
      .dtype = r.dtype,
      .format = r.format,
      .value_format = r.value_format,
      .delta = delta_ask(r),
      .gradient = data->bytes(),
      .keeps_gradient = data,
      .arrived = endpoint_.trace ? ShardTrace::now() : ShardTrace::TimePoint{}};
  return serve_after_body(std::move(push), data->data(), r.body_bytes);
}

kj::Maybe<kj::Promise<void>> DataSession::serve_after_body(Request request, std::byte* body,
                                                           uint64_t bytes) {
  KJ_IF_MAYBE (rest, reader_.body().read_or_wait(body, bytes)) {
    return rest->then(
        [this, request = std::move(request)]() mutable { plane_->serve(std::move(request)); });
  }
  plane_->serve(std::move(request));
  return nullptr;
}

kj::Maybe<kj::Promise<void>> DataSession::read_rows(const RequestHeader& r) {
  auto body = endpoint_.receive_buffers->take(r.body_bytes);
  Request rows{.kind = r.kind == wire::RequestKind::PUSH_ROWS ? RequestKind::push_rows
                                                              : RequestKind::pull_rows,
               .id = r.id,
               .variable = r.variable,
               .step = r.step,
               .dtype = r.dtype,
               .format = r.format,
               .value_format = r.value_format,
               .keeps_gradient = body};
  if (r.offset > r.body_bytes / sizeof(uint64_t)) {
    rows.refused = Error(ErrorCode::shape_mismatch,
                         fmt::format("rows of table id {} rejected: {} ids in a body of {} bytes",
                                     r.variable, r.offset, r.body_bytes));
  } else {
    rows.ids = body->bytes().first(r.offset * sizeof(uint64_t));
    rows.gradient = body->bytes().subspan(r.offset * sizeof(uint64_t));
  }
  return serve_after_body(std::move(rows), body->data(), r.body_bytes);
}

kj::Promise<void> DataSession::close_with(uint64_t id, Error error) {
  plane_->refuse(id, error);
  return plane_->drained().then([error]() -> kj::Promise<void> { return to_kj_exception(error); });
}

bool DataSession::has_room() {
  return !writer_.writing() && writer_.waiting_bytes() < kBatchBytes;
}

void DataSession::take(Answer& answer) {
  switch (answer.kind) {
    case AnswerKind::receipt:
      return writer_.add(encode(AnswerHeader{wire::AnswerKind::RECEIPT, answer.id}));
    case AnswerKind::value:
      return writer_.add(encode(AnswerHeader{wire::AnswerKind::VALUE, answer.id,
                                             answer.applied_step.value, answer.applied_at_ns,
                                             answer.value.size(), answer.format, answer.version}),
                         answer.value);
    case AnswerKind::error: {
      std::string text = describe(*answer.error);
      writer_.add_copied(
          encode(AnswerHeader{wire::AnswerKind::ERROR, answer.id, 0, 0, text.size()}),
          bytes_of(text));
      return;
    }
  }
}

}  // namespace psched
