// SPDX-License-Identifier: Apache-2.0
// DataChannel: a worker's data stream to one shard (net/data_frame.h). Pushes and polls go as
// frames, several to one write, each gradient sent from where it lies; each fresh value is
// read from the socket straight into its destination (the trainer's memory): no per-call RPC
// objects and no copy in between. ShardLink opens it beside its RPC connection, which keeps
// registration and pulls. KJ thread only.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include <kj/async-io.h>

#include "net/data_frame.h"
#include "net/stream_reader.h"

namespace psched {

class DataChannel final : private kj::TaskSet::ErrorHandler {
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
  ~DataChannel() noexcept;

  // Sends `request` (its id is set here) with `body` (a push's gradient, sent from where it
  // lies: the caller keeps it alive and unchanged until the promise resolves or is dropped).
  // Resolves at the receipt (push: with 0) or once the value is in `out` (poll, push_poll: with
  // the shard's wall clock at the answer); rejects with the shard's error, or DISCONNECTED
  // when the stream is lost. A value being read when its promise is dropped still lands in
  // `out`: keep `out` alive while the channel is. Dropping an unanswered poll cancels it.
  kj::Promise<int64_t> send(DataRequest request, std::span<const std::byte> body,
                            std::byte* out = nullptr, size_t out_bytes = 0);

 private:
  struct Waiting {
    kj::Own<kj::PromiseFulfiller<int64_t>> answer;
    RequestKind kind;
    std::byte* out;
    size_t out_bytes;
  };
  struct Outgoing {
    FrameHeaderBytes header;
    std::span<const std::byte> body;
  };

  // Reads the shard's answer to the preface; rejects with its refusal.
  kj::Promise<void> handshake();
  // Reads answers until the stream ends; each settles its request. Those already buffered are
  // taken at once, one after the other.
  kj::Promise<void> read_answers();
  // Settles the request `answer` is for, with its body; null when that is done, else what
  // finishes it (the rest of the body to read).
  kj::Maybe<kj::Promise<void>> take_answer(const DataAnswer& answer);
  kj::Maybe<kj::Promise<void>> take_value(const DataAnswer& answer);
  kj::Maybe<kj::Promise<void>> take_error(const DataAnswer& answer);
  // Forgets request `id` and returns what settles it; null when nothing waits for it (it was
  // answered, cancelled or never sent).
  kj::Own<kj::PromiseFulfiller<int64_t>> take_waiting(uint64_t id);
  // Drops `bytes` of body nobody waits for; null when there are none.
  kj::Maybe<kj::Promise<void>> discard(uint64_t bytes);
  // The promise of `id` went: forgets it, and cancels it on the shard when it was a poll.
  void abandon(uint64_t id);
  void queue(const FrameHeaderBytes& header, std::span<const std::byte> body);
  kj::Promise<void> write_queued();
  // The stream is lost: every waiting request, and every later one, rejects with `why`.
  void fail_all(kj::Exception why);
  void taskFailed(kj::Exception&& exception) override;

  kj::Own<kj::AsyncIoStream> stream_;
  StreamReader reader_;  // of stream_
  uint64_t max_answer_bytes_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Waiting> waiting_;
  std::vector<Outgoing> queued_;
  bool writing_ = false;  // a write_queued is scheduled or running
  // What the running write_queued writes (kept to reuse their memory).
  std::vector<Outgoing> in_write_;
  std::vector<kj::ArrayPtr<const kj::byte>> pieces_;
  FrameHeaderBytes header_{};  // the answer being read
  kj::Maybe<kj::Exception> broken_;
  kj::TaskSet tasks_;
};

}  // namespace psched
