// SPDX-License-Identifier: Apache-2.0
// RpcCalls: the DataPath (link/data_path.h) over a session's Cap'n Proto calls: push, poll and
// pushPoll, one partition each. A gradient that is whole words at a word boundary goes into the
// message from where it lies. KJ thread only.
#pragma once

#include "link/data_path.h"
#include "net/psched.capnp.h"

namespace psched {

class RpcCalls final : public DataPath {
 public:
  explicit RpcCalls(wire::Session::Client session) : session_(kj::mv(session)) {}
  ~RpcCalls() noexcept override = default;

  kj::Promise<void> push(const PartitionRequest& part) override;
  // The value is copied out of the answer's message into part.out.
  kj::Promise<Landed> poll(const PartitionRequest& part) override;
  kj::Promise<Landed> push_poll(const PartitionRequest& part) override;
  kj::Promise<void> push_rows(const RowsRequest& rows) override;
  kj::Promise<Landed> pull_rows(const RowsRequest& rows) override;

 private:
  wire::Session::Client session_;
};

}  // namespace psched
