// SPDX-License-Identifier: Apache-2.0
// PollRegistry: holds the polls that wait for an update to be applied.
//
// Lives on its shard's loop, owned by the StepMachine (actors/shard/step_machine.h), which calls
// it directly (no hop). The machine files a poll with the part of its range not yet applied; each
// apply the machine reports shrinks the waiting polls of the same (owner, variable, step); a poll
// whose range is fully applied is answered. Answers leave each connection in priority order
// (server/answer_queue.h), not here.
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "actors/runtime/actor.h"
#include "common/error.h"
#include "common/interval_set.h"
#include "common/result.h"
#include "common/types.h"

namespace psched {

// Whose update a poll waits for: a worker's own (async) or the aggregate (sync: kAllWorkers).
struct PollKey {
  WorkerId owner;
  VariableId variable;
  Step step;
  bool operator==(const PollKey&) const = default;
};

// Names one filed poll so its caller can withdraw it (the RPC glue does when a call is
// cancelled, e.g. its connection dropped). Unique per shard.
using PollTicket = Strong<struct PollTicketTag, uint64_t>;

struct PollKeyHash {
  size_t operator()(const PollKey& k) const noexcept {
    return (size_t{k.owner.value} * 0x9E3779B97F4A7C15ull) ^ (size_t{k.variable.value} << 20) ^
           k.step.value;
  }
};

class PollRegistry : public Actor {
 public:
  // Called on the loop when the poll is ready (ok) or can no longer be answered (why not).
  using Answer = std::function<void(const Result<>&)>;

  explicit PollRegistry(ActorLoop& shard_loop) : Actor(shard_loop) {}

  // Files a poll that waits until every index of `not_applied` is applied for `key`.
  void wait(PollKey key, PollTicket ticket, IntervalSet not_applied, Answer answer);
  // Forgets the poll with `ticket` unanswered; nothing happens when it was answered already.
  void withdraw(PollTicket ticket);
  // Reports that `range` of `key`'s update is applied; answers the polls this completes.
  void applied(PollKey key, ElementRange range);
  // Fails every waiting poll with `error` (shutdown).
  void fail_all(const Error& error);
  // Fails the polls waiting for `key` with `error`; returns how many there were.
  size_t fail(PollKey key, const Error& error);
  // Number of polls waiting.
  size_t waiting() const { return waiting_count_; }

 private:
  struct Waiting {
    PollTicket ticket;
    IntervalSet not_applied;
    Answer answer;
  };
  std::unordered_map<PollKey, std::vector<Waiting>, PollKeyHash> waiting_;
  std::unordered_map<PollTicket, PollKey> keys_;  // of every waiting poll
  size_t waiting_count_ = 0;
};

}  // namespace psched
