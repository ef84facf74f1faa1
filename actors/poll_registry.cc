#include "actors/poll_registry.h"

#include <algorithm>

#include "common/check.h"

namespace psched {

void PollRegistry::wait(PollKey key, IntervalSet not_applied, Priority priority, Answer answer) {
  PSCHED_REQUIRE(on_strand());
  if (not_applied.empty()) return answer(nullptr);
  waiting_[key].push_back({std::move(not_applied), priority, std::move(answer)});
  ++waiting_count_;
}

void PollRegistry::applied(PollKey key, ElementRange range) {
  PSCHED_REQUIRE(on_strand());
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
  std::stable_sort(ready.begin(), ready.end(),
                   [](const Waiting& a, const Waiting& b) { return a.priority < b.priority; });
  for (Waiting& poll : ready) poll.answer(nullptr);
}

void PollRegistry::fail_all(std::exception_ptr error) {
  PSCHED_REQUIRE(on_strand());
  auto all = std::move(waiting_);
  waiting_.clear();
  waiting_count_ = 0;
  for (auto& [key, polls] : all)
    for (Waiting& poll : polls) poll.answer(error);
}

}  // namespace psched
