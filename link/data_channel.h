// SPDX-License-Identifier: Apache-2.0
// DataChannel: the DataPath (link/data_path.h) over a worker's data stream to one shard
// (net/data_frame.h). Each partition's push, poll or pushPoll goes as one frame; the frames of
// one turn share a write (FrameWriter), each large gradient sent from where it lies; each fresh
// value is read from the socket straight into its destination (the trainer's memory): no
// per-call RPC objects and no copy in between. ShardLink opens it beside its RPC connection,
// which keeps registration and pulls. KJ thread only.
#pragma once

#include <cstdint>
#include <unordered_map>

#include <kj/async-io.h>

#include "link/data_path.h"
#include "net/frame_reader.h"
#include "net/frame_writer.h"

namespace psched {

class DataChannel final : public DataPath, private kj::TaskSet::ErrorHandler {
 public:
  // Presents `key` (from Session.openDataStream) on `stream`; resolves with the channel once
  // the shard accepted it, or rejects with the shard's refusal. Answers whose body is over
  // `max_answer_bytes` break the channel. `plain_socket`: `stream` is the TCP socket itself,
  // with no TLS or wrapper over it (net/stream_reader.h).
  static kj::Promise<kj::Own<DataChannel>> open(kj::Own<kj::AsyncIoStream> stream,
                                                kj::ArrayPtr<const kj::byte> key,
                                                uint64_t max_answer_bytes,
                                                bool plain_socket = false);

  DataChannel(kj::Own<kj::AsyncIoStream> stream, uint64_t max_answer_bytes, bool plain_socket);
  ~DataChannel() noexcept override;

  kj::Promise<void> push(const PartitionRequest& part) override;
  kj::Promise<Landed> poll(const PartitionRequest& part) override;
  kj::Promise<Landed> push_poll(const PartitionRequest& part) override;
  kj::Promise<void> push_rows(const RowsRequest& rows) override;
  kj::Promise<Landed> pull_rows(const RowsRequest& rows) override;

 private:
  // A request sent and not answered yet.
  struct Waiting {
    kj::Own<kj::PromiseFulfiller<Landed>> answer;
    wire::RequestKind kind;
    Landing landing;  // a poll's or pushPoll's: where its value lands, and in what form
  };

  // Sends the request for `part` as a frame; resolves when it is answered (a push: at its
  // receipt, with Landed{}), rejects with its refusal. A value being read when the promise is
  // dropped still lands in part.out. Dropping an unanswered poll cancels it.
  kj::Promise<Landed> send(wire::RequestKind kind, const PartitionRequest& part);
  // A push or pull of rows as one frame, its body the ids then (a push) the rows, both sent
  // from where they lie.
  kj::Promise<Landed> send_rows(wire::RequestKind kind, const RowsRequest& rows);
  // Reads the shard's answer to the preface; rejects with its refusal.
  kj::Promise<void> handshake();
  // Settles the request `bytes` answers, with its body (FrameReader::Serve).
  kj::Maybe<kj::Promise<void>> take_answer(const FrameHeaderBytes& bytes);
  kj::Maybe<kj::Promise<void>> take_value(const AnswerHeader& answer);
  // A value of rows at full width: each row read straight into its place, from row `k` on;
  // null when every row was buffered (they are in place on return).
  kj::Maybe<kj::Promise<void>> read_rows(const Landing& landing, size_t k);
  // A value in a narrow format: read whole, then widened into landing.out.
  kj::Maybe<kj::Promise<void>> take_narrowed(const AnswerHeader& answer, const Landing& landing);
  kj::Maybe<kj::Promise<void>> take_error(const AnswerHeader& answer);
  // Resolves request `id` with `outcome`, or rejects it with its refusal; nothing when nobody waits
  // for it (it was answered, cancelled or never sent).
  void settle(uint64_t id, Result<Landed> outcome);
  // Drops `bytes` of body nobody waits for; null when there are none.
  kj::Maybe<kj::Promise<void>> discard(uint64_t bytes);
  // The promise of `id` went: forgets it, and cancels it on the shard when it was a poll.
  void abandon(uint64_t id);
  // The stream is lost: every waiting request, and every later one, fails with `why`.
  void fail_all(Error why);
  void taskFailed(kj::Exception&& exception) override;

  kj::Own<kj::AsyncIoStream> stream_;
  FrameReader reader_;  // of stream_
  FrameWriter writer_;  // to stream_
  uint64_t max_answer_bytes_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Waiting> waiting_;
  std::optional<Error> broken_;
  kj::TaskSet tasks_;
};

}  // namespace psched
