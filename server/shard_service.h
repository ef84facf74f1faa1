// SPDX-License-Identifier: Apache-2.0
// The Cap'n Proto calls' front end of a shard: Shard (connect) and Session (register,
// openDataStream, and the data path: push, poll, pushPoll and pull). Register and
// openDataStream go to the shard and the endpoint directly; each data-path call is decoded into
// a Request for the worker's DataPlane (server/data_plane.h), which does the rest, and the call
// completes when the plane's answer comes back.
//
// Runs on the shard's loop, with the shard. Views into a call's parameters stay valid until it
// is answered (pushes are not cancellable), which is what lets the shard apply straight from
// them; a large value is referenced from the variable's memory into the answer's message.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "net/psched.capnp.h"
#include "server/connection_admission.h"
#include "server/data_plane.h"
#include "server/return_window.h"
#include "server/shard_endpoint.h"

namespace psched {

// One per connection; its sessions complete their calls within `window`.
class ShardService final : public wire::Shard::Server {
 public:
  // `admission` (optional; outlives the service) is told when `ticket`'s connection
  // authenticates, and logs refused connects.
  ShardService(ShardEndpoint& endpoint, kj::Own<ReturnWindow> window,
               ConnectionAdmission* admission = nullptr,
               std::shared_ptr<ConnectionTicket> ticket = nullptr)
      : endpoint_(endpoint),
        window_(kj::mv(window)),
        admission_(admission),
        ticket_(std::move(ticket)) {}

 protected:
  kj::Promise<void> connect(ConnectContext context) override;

 private:
  // Why a connect presenting `token` as worker `worker` is refused (too long a token, a wrong
  // one, a worker id not below the job's workers); none when it is not.
  std::optional<Error> refusal(capnp::Text::Reader token, uint32_t worker) const;
  // Counts the refused connect, logs it (rate-limited) and returns its exception.
  kj::Exception refuse_connect(const Error& error);
  // The cluster as this shard tells a connecting worker.
  void put_layout(wire::ClusterLayout::Builder layout) const;

  ShardEndpoint& endpoint_;
  kj::Own<ReturnWindow> window_;
  ConnectionAdmission* admission_;
  std::shared_ptr<ConnectionTicket> ticket_;
};

class SessionService final : public wire::Session::Server, private AnswerWriter {
 public:
  SessionService(ShardEndpoint& endpoint, WorkerId worker, kj::Own<ReturnWindow> window);
  ~SessionService();

 protected:
  kj::Promise<void> register_(RegisterContext context) override;
  kj::Promise<void> push(PushContext context) override;
  kj::Promise<void> poll(PollContext context) override;
  kj::Promise<void> pull(PullContext context) override;
  kj::Promise<void> pushPoll(PushPollContext context) override;
  kj::Promise<void> openDataStream(OpenDataStreamContext context) override;
  kj::Promise<void> join(JoinContext context) override;
  kj::Promise<void> registerTable(RegisterTableContext context) override;
  kj::Promise<void> pushRows(PushRowsContext context) override;
  kj::Promise<void> pullRows(PullRowsContext context) override;

 private:
  // Puts an answer into a call's results (nothing for a receipt).
  using Write = std::function<void(const Answer&)>;

  // Hands `request` to the plane; resolves once `write` put its answer into the results,
  // rejects with its error. Dropped unanswered, it withdraws the request's poll.
  kj::Promise<void> ask(Request request, Write write);
  // A new request id of this session's.
  uint64_t next_id() { return next_id_++; }
  // Forgets the unanswered request `id` (its call went away).
  void forget(uint64_t id);

  // AnswerWriter: a call completes while the connection's ReturnWindow has room.
  bool has_room() override { return window_->has_room(); }
  void take(Answer& answer) override;
  void send() override {}  // each call completed in take()
  kj::Promise<void> written() override { return kj::READY_NOW; }

  ShardEndpoint& endpoint_;
  std::weak_ptr<bool> endpoint_alive_;  // the endpoint's
  WorkerId worker_;
  kj::Own<ReturnWindow> window_;  // the connection's
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Write> unanswered_;  // by request id
  std::string data_key_;  // the key this session gave out last, while unused
  // Expires with the service: a call's promise may be dropped after it.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::shared_ptr<DataPlane> plane_;  // last: it withdraws its polls first
};

// True when `a` and `b` are equal, taking time that depends only on their lengths.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace psched
