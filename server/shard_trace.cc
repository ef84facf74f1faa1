// SPDX-License-Identifier: Apache-2.0
#include "server/shard_trace.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "common/chrome_events.h"

namespace psched {
namespace {

const char* group_name(ShardTrace::Kind kind) {
  return kind == ShardTrace::Kind::push ? "pushes" : "answers";
}

std::pair<const char*, const char*> phase_names(ShardTrace::Kind kind) {
  return kind == ShardTrace::Kind::push ? std::pair{"receive", "apply"}
                                        : std::pair{"wait", "answer"};
}

// Names track `tid` of process `pid`; tracks sort in the order they were made.
void name_track(nlohmann::json& events, int pid, int tid, const std::string& name) {
  events.push_back({{"ph", "M"},
                    {"name", "thread_name"},
                    {"pid", pid},
                    {"tid", tid},
                    {"args", {{"name", name}}}});
  events.push_back({{"ph", "M"},
                    {"name", "thread_sort_index"},
                    {"pid", pid},
                    {"tid", tid},
                    {"args", {{"sort_index", tid}}}});
}

// One request on track `tid`: a slice for the whole of it, one for each of its two phases.
void request_slices(nlohmann::json& events, int pid, int tid, const ShardTrace::Request& r,
                    ShardTrace::TimePoint epoch) {
  auto slice = [&](const std::string& label, ShardTrace::TimePoint from, ShardTrace::TimePoint to,
                   nlohmann::json args) {
    events.push_back(trace_slice(label, pid, tid, from, to, epoch, std::move(args)));
  };
  const bool push = r.kind == ShardTrace::Kind::push;
  nlohmann::json detail{
      {"variable", r.variable.value}, {"step", r.step.value}, {"begin", r.range.begin},
      {"end", r.range.end},           {"bytes", r.bytes},     {"format", to_string(r.format)}};
  if (!push) detail["priority"] = r.priority.value;
  slice(fmt::format("{} v{} s{} [{}, {})", push ? "push" : "poll", r.variable.value, r.step.value,
                    r.range.begin, r.range.end),
        r.begin, r.end, std::move(detail));
  auto [first, second] = phase_names(r.kind);
  slice(first, r.begin, r.middle, nullptr);
  slice(second, r.middle, r.end, nullptr);
}

}  // namespace

void ShardTrace::add(const Request& request) {
  if (requests_.size() == capacity_) {
    ++dropped_;
    return;
  }
  requests_.push_back(request);
}

void ShardTrace::append_events(nlohmann::json& events, int pid, const std::string& name,
                               TimePoint epoch) const {
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", pid},
                    {"args", {{"name", name}, {"dropped_requests", dropped_}}}});
  // Each worker's pushes, then its answers, on tracks of their own.
  std::map<std::pair<uint32_t, Kind>, std::vector<const Request*>> groups;
  for (const Request& r : requests_) groups[{r.worker.value, r.kind}].push_back(&r);
  int next_tid = 0;
  for (auto& [key, requests] : groups) {
    auto [worker, kind] = key;
    std::sort(requests.begin(), requests.end(),
              [](const Request* a, const Request* b) { return a->begin < b->begin; });
    TraceLanes lanes;
    std::map<size_t, int> tids;  // lane -> track
    for (const Request* r : requests) {
      auto [it, fresh] = tids.try_emplace(lanes.take(r->begin, r->end), next_tid);
      if (fresh)
        name_track(events, pid, next_tid++, fmt::format("worker {} {}", worker, group_name(kind)));
      request_slices(events, pid, it->second, *r, epoch);
    }
  }
}

}  // namespace psched
