// SPDX-License-Identifier: Apache-2.0
// FuzzShard: one shard with its actor, RPC endpoint and listener, on one thread, for feeding
// a client connection's raw bytes to the real decode and handler path (the libFuzzer target,
// the corpus replay test and the seed generator share it). Deterministic: the shard's event
// loop runs on the calling thread, with no timers.
//
// The shard reads a fed connection one read at a time, each only once the loop is idle, so
// every message is handled and answered before the next arrives, as a client that waits for
// its answers would have it (Cap'n Proto reuses question ids once answered). Eager delivery
// instead hands out the whole input in one turn, so the connection may close with calls
// still unanswered (polls waiting).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <kj/async-io.h>

#include "actors/shard/variable_shard.h"
#include "config/deployment.h"
#include "server/shard_listener.h"

namespace psched::fuzz {

// The deployment the fuzzer runs against: 2 workers, token "fuzz", and limits small enough
// that inputs reach them (1 MiB messages, 8 variables, 16 waiting polls).
DeploymentConfig fuzz_config(Mode mode);

// A fuzz input: its first byte holds options (bit 0: sync mode, bit 1: eager delivery, bit 2:
// a data stream), the rest is what one client sends on its connection: RPC messages, or with
// bit 2 the frames of a data stream (net/data_frame.h) after a valid preface and key, to a
// shard that already holds the data stream variables.
Mode input_mode(std::span<const uint8_t> input);
bool input_eager(std::span<const uint8_t> input);
bool input_data_stream(std::span<const uint8_t> input);

// The variables a data stream input finds registered: ids 0 and 1.
inline constexpr uint64_t kDataFloatElements = 1024;  // id 0: float32, sgd
inline constexpr uint64_t kDataDoubleElements = 64;   // id 1: float64, adam

class FuzzShard {
 public:
  explicit FuzzShard(Mode mode);
  ~FuzzShard();

  // Opens a connection to the shard over an in-memory pipe; returns the client's end.
  kj::Own<kj::AsyncIoStream> connect();
  // Serves a connection whose client sends `bytes` and then closes its side; the shard's
  // answers are dropped. Returns when the shard has read it all or stopped reading, and
  // the loop is idle.
  void feed(std::span<const uint8_t> bytes, bool eager = false);
  // Registers the data stream variables (once) and feeds `frames` as a worker's data stream
  // would send them, after the preface and a key the shard handed out.
  void feed_data(std::span<const uint8_t> frames, bool eager = false);
  // Runs the loop until `promise` resolves; returns its value (rethrows its failure).
  template <typename T>
  T run(kj::Promise<T> promise) {
    if (promise.poll(scope_)) return promise.wait(scope_);
    stalled();
  }
  // Runs the loop until it has no work left.
  void settle();
  ShardStats stats();

 private:
  [[noreturn]] void stalled();
  void register_data_variables();
  bool data_variables_ = false;

  DeploymentConfig config_;
  kj::EventLoop loop_;
  kj::WaitScope scope_;
  ActorLoop actors_;
  std::unique_ptr<VariableShard> shard_;
  std::unique_ptr<ShardEndpoint> endpoint_;
  std::unique_ptr<ShardListener> listener_;
};

// Runs one fuzz input through a fresh FuzzShard.
void run_input(std::span<const uint8_t> input);

}  // namespace psched::fuzz
