// SPDX-License-Identifier: Apache-2.0
#include "server/answer_order.h"

namespace psched {

void AnswerOrder::serve(RpcConnection& connection) {
  connection_ = &connection;
  connection.on_written([this] { written(); });
}

void AnswerOrder::submit(Priority priority, uint64_t bytes,
                         kj::Own<kj::PromiseFulfiller<void>> send) {
  if (closed_) return;
  waiting_.push(Waiting{priority, next_sequence_++, bytes, kj::mv(send)});
  send_while_room();
}

void AnswerOrder::written() {
  check_at_end_of_turn();  // Cap'n Proto counts the write done in a later continuation
}

void AnswerOrder::check_at_end_of_turn() {
  if (check_scheduled_) return;
  check_scheduled_ = true;
  end_of_turn_.add(kj::evalLast([this] {
    check_scheduled_ = false;
    sent_this_turn_ = 0;
    send_while_room();
  }));
}

void AnswerOrder::send_while_room() {
  while (connection_ && !waiting_.empty() &&
         connection_->queued_bytes() + sent_this_turn_ < window_) {
    // priority_queue::top is const; the entry is popped right after its fulfiller is taken.
    auto& best = const_cast<Waiting&>(waiting_.top());
    kj::Own<kj::PromiseFulfiller<void>> send = kj::mv(best.send);
    uint64_t bytes = best.bytes;
    waiting_.pop();
    if (!send->isWaiting()) continue;
    send->fulfill();
    sent_this_turn_ += bytes;
    check_at_end_of_turn();
  }
}

void AnswerOrder::taskFailed(kj::Exception&& exception) {
  kj::throwFatalException(kj::mv(exception));  // a bug: send_while_room throws nothing
}

void AnswerOrder::close() {
  closed_ = true;
  if (connection_) connection_->on_written(nullptr);
  connection_ = nullptr;
  while (!waiting_.empty()) waiting_.pop();
}

}  // namespace psched
