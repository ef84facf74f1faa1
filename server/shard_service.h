// SPDX-License-Identifier: Apache-2.0
// The RPC face of a shard: Shard (connect) and Session (register, push, poll, pushPoll, pull,
// ...) servers that turn calls into VariableShard messages and the actor's replies into answers.
//
// Runs on the shard's loop, with the shard: a call reaches it as a direct call, and a fresh
// value is read from the variable straight into the answer's message. Views into a call's
// parameters stay valid until it is answered (pushes are not cancellable), which is what lets
// the shard apply straight from them.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <unordered_map>

#include "actors/shard/variable_shard.h"
#include "config/deployment.h"
#include "net/psched.capnp.h"
#include "server/answer_order.h"
#include "server/connection_admission.h"
#include "server/receive_buffers.h"
#include "server/request_checks.h"
#include "server/shard_trace.h"

namespace psched {

// What every connection to one shard shares; outlives the connections.
struct ShardEndpoint {
  VariableShard& shard;
  const DeploymentConfig& config;
  ShardId id;
  uint64_t next_poll_ticket = 1;
  // Keys a session gave out for opening its data stream (server/data_session.h), each good for
  // one stream of that session's worker.
  std::unordered_map<std::string, WorkerId> data_keys{};
  // Where the data streams record their requests; null when not tracing.
  ShardTrace* trace = nullptr;
  // The data streams' gradient buffers, reused; up to limits.max_message_bytes kept free.
  std::shared_ptr<ReceiveBuffers> receive_buffers =
      ReceiveBuffers::make(config.limits.max_message_bytes);
  // Expires when the endpoint goes; cleanup that may outlive it (a cancelled poll's promise,
  // destroyed with the event loop) checks it before touching the shard.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

// One per connection; its sessions send their poll answers in `order`.
class ShardService final : public wire::Shard::Server {
 public:
  // `admission` (optional; outlives the service) is told when `ticket`'s connection
  // authenticates, and logs refused connects.
  ShardService(ShardEndpoint& endpoint, kj::Own<AnswerOrder> order,
               ConnectionAdmission* admission = nullptr,
               std::shared_ptr<ConnectionTicket> ticket = nullptr)
      : endpoint_(endpoint),
        order_(kj::mv(order)),
        admission_(admission),
        ticket_(std::move(ticket)) {}

 protected:
  kj::Promise<void> connect(ConnectContext context) override;

 private:
  // Counts the refused connect, logs it (rate-limited) and returns its exception.
  kj::Exception refuse_connect(Error error);

  ShardEndpoint& endpoint_;
  kj::Own<AnswerOrder> order_;
  ConnectionAdmission* admission_;
  std::shared_ptr<ConnectionTicket> ticket_;
};

class SessionService final : public wire::Session::Server {
 public:
  SessionService(ShardEndpoint& endpoint, WorkerId worker, kj::Own<AnswerOrder> order)
      : endpoint_(endpoint), worker_(worker), order_(kj::mv(order)) {}
  ~SessionService();

 protected:
  kj::Promise<void> register_(RegisterContext context) override;
  kj::Promise<void> push(PushContext context) override;
  kj::Promise<void> poll(PollContext context) override;
  kj::Promise<void> pull(PullContext context) override;
  kj::Promise<void> pushFused(PushFusedContext context) override;
  kj::Promise<void> pollFused(PollFusedContext context) override;
  kj::Promise<void> pushPoll(PushPollContext context) override;
  kj::Promise<void> pushPollFused(PushPollFusedContext context) override;
  kj::Promise<void> openDataStream(OpenDataStreamContext context) override;

 private:
  // Checks a push's size and dtype; throws psched::Error naming what is wrong. `fields`: a
  // reader with variable, step, offset, dtype and data (push's and pushPoll's parameters, a
  // fused Partition). Defined in shard_service.cc, its only user.
  template <typename Fields>
  PushArgs decode_push(Fields fields) const;
  // Hands the push to the shard; resolves with its receipt.
  kj::Promise<void> push_one(const PushArgs& push);
  // Writes a ready poll's value into the call's results, with the shard's wall clock then.
  using WriteValue = std::function<void(const FreshValue&, int64_t answered_at_ns)>;
  // Files the poll with the shard; once its value is ready, `write` puts it into the results
  // and the promise resolves when the connection's AnswerOrder lets the answer go. Dropped
  // unanswered, the promise withdraws the poll.
  kj::Promise<void> poll_one(VariableId variable, Step step, uint64_t offset, uint64_t count,
                             WriteValue write);
  // The push, then the poll of its range: resolves when the poll's answer may go, rejects
  // with the push's refusal (the poll withdrawn) or the poll's.
  kj::Promise<void> push_then_poll(const PushArgs& push, WriteValue write);

  // Throws unless a fused call of `parts` partitions is within limits.max_fused_partitions.
  void check_fused(const char* what, size_t parts) const;
  // Throws unless the answer to a fused poll of `ranges` fits the message limit (as float32).
  void check_answer_fits(capnp::List<wire::PolledRange>::Reader ranges) const;

  ShardEndpoint& endpoint_;
  WorkerId worker_;
  kj::Own<AnswerOrder> order_;  // the connection's
  // This connection's unanswered polls; shared with the polls, which may be dropped after the
  // service.
  std::shared_ptr<uint64_t> waiting_polls_ = std::make_shared<uint64_t>(0);
  std::string data_key_;  // the key this session gave out last, while unused
};

// True when `a` and `b` are equal, taking time that depends only on their lengths.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace psched
