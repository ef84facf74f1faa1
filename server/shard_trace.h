// SPDX-License-Identifier: Apache-2.0
// ShardTrace: what one shard did with each request of its workers' data path, for a Chrome
// trace (Perfetto, chrome://tracing) to lay beside the workers' (client/chrome_trace.h,
// psched.torch's). A request is a slice of two phases:
//   push  receive  its frame's header read to its last byte read (empty for a Cap'n Proto
//                  call, which arrives whole)
//         apply    its last byte read to its receipt (the optimizer update, on the shard's
//                  loop or the apply pool)
//   poll  wait     filed to its fresh value ready (sync mode: until every worker's push of the
//                  step is applied)
//         answer   the value ready to its last byte handed to the kernel (behind better
//                  answers, and a full socket)
// Times are steady_clock, which is CLOCK_MONOTONIC on Linux: the workers' axis too, when they
// run on the same machine. Lives on the shard's loop, like the shard; keeps the first
// `capacity` requests and counts the rest. DataPlane (server/data_plane.h) records them, for
// both front ends.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/placement.h"
#include "common/types.h"
#include "compression/wire_format.h"

namespace psched {

class ShardTrace {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  enum class Kind : uint8_t { push, poll };
  struct Request {
    Kind kind;
    WorkerId worker;
    VariableId variable;
    Step step;
    ElementRange range;
    uint64_t bytes;     // on the wire, in `format`
    WireFormat format;  // of the gradient (push) or the value (poll)
    Priority priority;  // a poll's, from its variable; 0 for a push
    TimePoint begin;    // header read (push) or filed (poll)
    TimePoint middle;   // last byte read (push) or value ready (poll)
    TimePoint end;      // receipt (push) or last byte written (poll)
  };

  explicit ShardTrace(size_t capacity) : capacity_(capacity) {}

  static TimePoint now() { return std::chrono::steady_clock::now(); }
  void add(const Request& request);
  size_t size() const { return requests_.size(); }
  size_t dropped() const { return dropped_; }
  const std::vector<Request>& requests() const { return requests_; }

  // The trace events, appended to `events`: process `pid` named `name`, with two groups of
  // tracks per worker ("worker W pushes", "worker W answers"); times in microseconds since
  // `epoch` (TimePoint{}: the clock's own zero, the axis of time.monotonic()).
  void append_events(nlohmann::json& events, int pid, const std::string& name,
                     TimePoint epoch = {}) const;

 private:
  size_t capacity_;
  size_t dropped_ = 0;
  std::vector<Request> requests_;
};

}  // namespace psched
