// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/poll_registry.h"

#include "common/check.h"

namespace psched {

void PollRegistry::wait(PollKey key, PollTicket ticket, IntervalSet not_applied, Answer answer) {
  PSCHED_REQUIRE(on_loop());
  if (not_applied.empty()) return answer(Result<>());
  PSCHED_REQUIRE(!keys_.contains(ticket), ticket.value);
  waiting_[key].push_back({ticket, std::move(not_applied), std::move(answer)});
  keys_.emplace(ticket, key);
  ++waiting_count_;
}

void PollRegistry::withdraw(PollTicket ticket) {
  PSCHED_REQUIRE(on_loop());
  auto key = keys_.find(ticket);
  if (key == keys_.end()) return;
  auto polls = waiting_.find(key->second);
  std::erase_if(polls->second, [ticket](const Waiting& w) { return w.ticket == ticket; });
  if (polls->second.empty()) waiting_.erase(polls);
  keys_.erase(key);
  --waiting_count_;
}

void PollRegistry::applied(PollKey key, ElementRange range) {
  PSCHED_REQUIRE(on_loop());
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<Waiting> ready;
  auto& polls = it->second;
  for (auto poll = polls.begin(); poll != polls.end();) {
    poll->not_applied.subtract(range);
    if (poll->not_applied.empty()) {
      ready.push_back(std::move(*poll));
      poll = polls.erase(poll);
    } else {
      ++poll;
    }
  }
  if (polls.empty()) waiting_.erase(it);
  waiting_count_ -= ready.size();
  for (const Waiting& poll : ready) keys_.erase(poll.ticket);
  for (Waiting& poll : ready) poll.answer(Result<>());
}

void PollRegistry::fail_all(const Error& error) {
  PSCHED_REQUIRE(on_loop());
  auto all = std::move(waiting_);
  waiting_.clear();
  keys_.clear();
  waiting_count_ = 0;
  for (auto& [key, polls] : all)
    for (Waiting& poll : polls) poll.answer(error);
}

size_t PollRegistry::fail(PollKey key, const Error& error) {
  PSCHED_REQUIRE(on_loop());
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return 0;
  std::vector<Waiting> polls = std::move(it->second);
  waiting_.erase(it);
  for (const Waiting& poll : polls) keys_.erase(poll.ticket);
  waiting_count_ -= polls.size();
  for (Waiting& poll : polls) poll.answer(error);
  return polls.size();
}

}  // namespace psched
