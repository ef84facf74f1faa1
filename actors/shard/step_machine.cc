// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/step_machine.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/durability/state_codec.h"
#include "common/error.h"
#include "common/log.h"
#include "common/result.h"

namespace psched {
namespace {

using Clock = StepMachine::Clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

StepMachine::StepMachine(ActorLoop& loop, const ShardSettings& settings, Host& host)
    : settings_(settings),
      host_(host),
      members_(settings.workers,
               settings.steps.min_workers ? settings.steps.min_workers : settings.workers),
      leases_(settings.workers, settings.steps.lease_seconds),
      polls_(loop),
      pushed_(settings.workers) {}

void StepMachine::add(std::string name, ElementRange extent, StepRule rule) {
  if (strictness(rule.mode) > strictness(settings_.mode))
    fail(ErrorCode::bad_config, "'{}' steps in mode {}, stricter than the job's mode {}", name,
         to_string(rule.mode), to_string(settings_.mode));
  const Membership* members = rule.mode == Mode::async ? nullptr : &members_;
  tracks_.emplace_back(std::move(name), extent, rule.mode, settings_.workers, members);
  staleness_.push_back(rule.staleness);
}

StepMachine::Admission StepMachine::admit(WorkerId worker, VariableId id, Step step,
                                          ElementRange range) {
  if (!tracks_[id.value].is_duplicate(worker, step, range)) return Admission::fresh;
  auto closed = closed_without_.find(id.value);
  if (closed == closed_without_.end() || closed->second.first != step) return Admission::duplicate;
  const std::vector<uint32_t>& missing = closed->second.second;
  if (std::find(missing.begin(), missing.end(), worker.value) == missing.end())
    return Admission::duplicate;
  ++late_pushes_;
  return Admission::late;
}

void StepMachine::take(HostedKind& kind, const Push& push, ElementRange units,
                       Clock::time_point now, Taken taken) {
  if (holds(push)) {
    ++pushes_held_;
    held_pushes_.push_back({&kind, push, units, std::move(taken)});
    return;
  }
  taken(attempt([&] { return take_now(kind, push, units, now); }), false);
}

StepMachine::Admission StepMachine::take_now(HostedKind& kind, const Push& push, ElementRange units,
                                             Clock::time_point now) {
  const Admission admission = admit(push.worker, push.variable, push.step, units);
  if (admission != Admission::fresh) return admission;
  host_.log_push(push);
  const StepUpdate update = tracks_[push.variable.value].receive(push.worker, push.step, units);
  kind.take(update, push);
  applied(push.worker, push.variable, update, now);
  return admission;
}

bool StepMachine::holds(const Push& push) const {
  return mode_of(push.variable) == Mode::sync &&
         push.step == tracks_[push.variable.value].applied_step(kAllWorkers).next().next();
}

void StepMachine::release_pushes(VariableId id, Clock::time_point now) {
  if (held_pushes_.empty()) return;
  const Step under_way = tracks_[id.value].applied_step(kAllWorkers).next();
  std::vector<HeldPush> ready;
  std::erase_if(held_pushes_, [&](HeldPush& held) {
    if (held.push.variable != id || held.push.step != under_way) return false;
    ready.push_back(std::move(held));
    return true;
  });
  for (HeldPush& held : ready) {  // each may complete the step, and take the next step's
    Result<Admission> admission =
        attempt([&] { return take_now(*held.kind, held.push, held.units, now); });
    if (!admission) host_.count_error(admission.error());
    held.taken(admission, true);
  }
}

void StepMachine::fail_pushes(const std::function<bool(const HeldPush&)>& which,
                              const Error& error) {
  std::vector<HeldPush> failed;
  std::erase_if(held_pushes_, [&](HeldPush& held) {
    if (!which(held)) return false;
    failed.push_back(std::move(held));
    return true;
  });
  for (HeldPush& held : failed) held.taken(error, true);
}

void StepMachine::applied(WorkerId worker, VariableId id, const StepUpdate& update,
                          Clock::time_point now) {
  StepTrack& track = tracks_[id.value];
  answer_polls(id, track.poll_owner(worker), update);
  if (!has_members()) return;
  members_.pushed(worker);
  pushed_[worker.value] = std::max(pushed_[worker.value], update.step);
  if (mode_of(id) == Mode::async) return;
  if (mode_of(id) == Mode::bounded) return release_held(id);
  keep_short_handed(track);
  time_step(id, now);
  if (!held_.empty()) release_held(id);
  release_pushes(id, now);
}

void StepMachine::answer_polls(VariableId id, WorkerId owner, const StepUpdate& update) {
  const PollKey key{owner, id, update.step};
  for (const StepPiece& piece : update.pieces) {
    if (!piece.complete) continue;
    ++pieces_applied_;
    polls_.applied(key, piece.range);
  }
}

void StepMachine::poll(const Poll& poll, Answer answer, Clock::time_point now) {
  HeldPoll held{poll, std::move(answer), now};
  if (holds(poll)) {
    ++polls_held_;
    held_.push_back(std::move(held));
    return;
  }
  file(held);
}

bool StepMachine::holds(const Poll& poll) const {
  const StepTrack& track = tracks_[poll.variable.value];
  switch (mode_of(poll.variable)) {
    case Mode::async:
      return false;
    case Mode::bounded:
      track.not_yet_applied(poll.worker, poll.step, poll.range);  // its checks, before holding it
      return still_held(poll);
    case Mode::sync:
      if (!still_held(poll)) return false;
      track.not_yet_applied(poll.worker, Step(poll.step.value - 1), poll.range);
      return true;
  }
  return false;
}

bool StepMachine::still_held(const Poll& poll) const {
  const StepTrack& track = tracks_[poll.variable.value];
  const Mode mode = mode_of(poll.variable);
  if (mode == Mode::bounded) return !track.behind(poll.step, staleness_of(poll.variable)).empty();
  return mode == Mode::sync && poll.step > track.applied_step(poll.worker).next();
}

void StepMachine::file(const HeldPoll& held) {
  const Poll& poll = held.poll;
  const StepTrack& track = tracks_[poll.variable.value];
  IntervalSet pending = track.not_yet_applied(poll.worker, poll.step, poll.range);
  polls_.wait({track.poll_owner(poll.worker), poll.variable, poll.step}, poll.ticket,
              std::move(pending), held.answer);
}

void StepMachine::file_held(const HeldPoll& held) {
  try {
    file(held);
  } catch (...) {
    Error refused = caught();
    host_.count_error(refused);
    held.answer(refused);
  }
}

void StepMachine::withdraw(PollTicket ticket) {
  std::erase_if(held_, [ticket](const HeldPoll& held) { return held.poll.ticket == ticket; });
  polls_.withdraw(ticket);
}

void StepMachine::fail_all(const Error& error) {
  fail_pushes([](const HeldPush&) { return true; }, error);
  for (HeldPoll& held : std::exchange(held_, {})) held.answer(error);
  polls_.fail_all(error);
}

std::vector<StepMachine::HeldPoll> StepMachine::take_held(
    const std::function<bool(const HeldPoll&)>& which) {
  std::vector<HeldPoll> taken;
  std::erase_if(held_, [&](HeldPoll& held) {
    if (!which(held)) return false;
    taken.push_back(std::move(held));
    return true;
  });
  return taken;
}

void StepMachine::release_held(std::optional<VariableId> variable) {
  auto ready = take_held([&](const HeldPoll& held) {
    const Poll& poll = held.poll;
    return (!variable || poll.variable == *variable) && !still_held(poll);
  });
  for (const HeldPoll& held : ready) file_held(held);
}

Step StepMachine::join(WorkerId worker, Step at_least, Clock::time_point now) {
  if (worker.value >= settings_.workers)
    fail(ErrorCode::invalid_argument,
         "join rejected: worker id {} is not below the job's {} workers", worker.value,
         settings_.workers);
  if (settings_.mode == Mode::async) return resume_step(worker);
  at_least = std::max(at_least, Step(1));
  Step from;
  if (members_.is_member(worker) && !members_.has_pushed(worker))
    from = std::max(members_.joined_at(worker), at_least);
  else
    from =
        std::max(at_least, settings_.mode == Mode::sync ? frontier().next() : level_step(worker));
  if (from != members_.joined_at(worker) || members_.has_pushed(worker))
    join_from(worker, from, now);
  return from;
}

Step StepMachine::resume_step(WorkerId worker) const {
  std::optional<Step> from;
  for (const StepTrack& track : tracks_) {
    Step next = track.applied_step(worker).next();
    from = from ? std::min(*from, next) : next;
  }
  return from.value_or(Step());
}

Step StepMachine::level_step(WorkerId worker) const {
  Step from(1);
  for (const StepTrack& track : tracks_) {
    from = std::max(from, track.applied_step(worker).next());
    std::optional<Step> slowest;
    for (uint32_t w = 0; w < settings_.workers; ++w)
      if (w != worker.value && members_.is_member(WorkerId(w)))
        slowest = std::min(slowest.value_or(Step(UINT64_MAX)), track.applied_step(WorkerId(w)));
    if (slowest) from = std::max(from, slowest->next());
  }
  return from;
}

Step StepMachine::frontier() const {
  Step newest;
  for (const StepTrack& track : tracks_) newest = std::max(newest, track.begun_step());
  return newest;
}

void StepMachine::join_from(WorkerId worker, Step from, Clock::time_point now) {
  host_.log_join(worker, from);
  bool rejoined = members_.has_pushed(worker);
  members_.join(worker, from);
  for (uint32_t i = 0; i < tracks_.size(); ++i)
    if (mode_of(VariableId(i)) == Mode::bounded) tracks_[i].skip_to(worker, Step(from.value - 1));
  ++joins_;
  log_info("shard {}: worker {} {} the job at step {} ({} of {} workers members)",
           settings_.id.value, worker.value, rejoined ? "rejoins" : "joins", from,
           members_.members(), settings_.workers);
  settle_all(now);
}

void StepMachine::leave(WorkerId worker, std::string_view why, Clock::time_point now) {
  host_.log_leave(worker);
  members_.leave(worker);
  ++leaves_;
  log_warn("shard {}: worker {} left the job at step {}: {}; {} of {} workers members{}",
           settings_.id.value, worker.value, frontier(), why, members_.members(), settings_.workers,
           members_.quorum()
               ? ""
               : fmt::format(", below sync.min_workers ({}): steps wait", members_.min_workers()));
  settle_all(now);
}

void StepMachine::settle_all(Clock::time_point now) {
  for (uint32_t i = 0; i < tracks_.size(); ++i) {
    const VariableId id(i);
    if (mode_of(id) != Mode::sync) continue;
    for (const StepUpdate& update : tracks_[i].settle()) {
      host_.apply_gathered(id, update);
      answer_polls(id, kAllWorkers, update);
    }
    keep_short_handed(tracks_[i]);
    time_step(id, now);
  }
  release_held(std::nullopt);
  for (uint32_t i = 0; i < tracks_.size(); ++i) release_pushes(VariableId(i), now);
}

void StepMachine::connected(WorkerId worker) {
  if (worker.value < settings_.workers) leases_.connected(worker);
}

void StepMachine::disconnected(WorkerId worker, Clock::time_point now) {
  if (worker.value < settings_.workers) leases_.disconnected(worker, now);
}

void StepMachine::enforce(Clock::time_point now) {
  if (!has_members()) return;
  if (settings_.steps.timeout_seconds > 0) {
    time_out_steps(now);  // sync variables' steps
    time_out_held(now);   // bounded variables' held polls
  }
  end_leases(now);
}

void StepMachine::end_leases(Clock::time_point now) {
  for (WorkerId worker : leases_.ended(now)) {
    if (!members_.is_member(worker)) continue;
    try {
      leave(
          worker,
          fmt::format("no connection for {} s (sync.lease_seconds)", settings_.steps.lease_seconds),
          now);
    } catch (...) {
      Error error = caught();
      host_.count_error(error);
      log_error(
          "shard {}: worker {}'s lease ended but its leave could not be logged ({}); it "
          "stays a member",
          settings_.id.value, worker.value, error.what());
    }
  }
}

void StepMachine::resumed(Clock::time_point now) {
  if (frontier() != Step()) leases_.start_all(now);
}

void StepMachine::time_step(VariableId id, Clock::time_point now) {
  if (!tracks_[id.value].step_in_progress())
    step_began_.erase(id.value);
  else
    step_began_.try_emplace(id.value, now);
}

Error StepMachine::timed_out(const std::string& message) {
  Error error(ErrorCode::sync_timeout, message);
  ++timeouts_;
  host_.count_error(error);
  log_warn("{}", error.what());
  return error;
}

void StepMachine::time_out_steps(Clock::time_point now) {
  std::vector<uint32_t> overdue;
  for (const auto& [id, began] : step_began_)
    if (seconds_between(began, now) >= settings_.steps.timeout_seconds) overdue.push_back(id);
  for (uint32_t id : overdue) time_out_step(VariableId(id), now);
}

void StepMachine::time_out_step(VariableId id, Clock::time_point now) {
  const StepTrack& track = tracks_[id.value];
  const Step step = track.applied_step(kAllWorkers).next();
  std::vector<uint32_t> missing = track.missing_workers();
  Error error = timed_out(fmt::format(
      "step {} of variable '{}' on shard {} waited {:.1f} s for worker(s) {}{}", step, track.name(),
      settings_.id.value, seconds_between(step_began_[id.value], now), fmt::join(missing, ", "),
      proceeds() ? "; applied without them (their pushes of it are dropped)" : ""));
  if (!proceeds()) {
    polls_.fail({kAllWorkers, id, step}, error);
    for (const HeldPoll& held : take_held([&](const HeldPoll& h) { return h.poll.variable == id; }))
      held.answer(error);  // held for the step after this one, which waits as long
    fail_pushes([&](const HeldPush& h) { return h.push.variable == id; }, error);
    step_began_[id.value] = now;  // fail the polls filed from now on after as long
    return;
  }
  try {
    close_without_missing(id, step);
  } catch (...) {
    Error refused = caught();
    host_.count_error(refused);
    log_error(
        "shard {}: step {} of variable '{}' could not close without worker(s) {} ({}); it "
        "waits on",
        settings_.id.value, step, track.name(), fmt::join(missing, ", "), refused.what());
    return;
  }
  closed_without_[id.value] = {step, std::move(missing)};
  step_began_.erase(id.value);
  release_held(id);
  release_pushes(id, now);
}

void StepMachine::close_without_missing(VariableId id, Step step) {
  host_.log_timeout(id, step);
  StepTrack& track = tracks_[id.value];
  const StepUpdate update = track.complete_without_missing();
  host_.apply_gathered(id, update);
  answer_polls(id, kAllWorkers, update);
  keep_short_handed(track);
}

void StepMachine::time_out_held(Clock::time_point now) {
  const double timeout = settings_.steps.timeout_seconds;
  auto overdue = take_held([&](const HeldPoll& held) {  // sync's held polls go with their step
    return mode_of(held.poll.variable) == Mode::bounded &&
           seconds_between(held.since, now) >= timeout;
  });
  for (const HeldPoll& held : overdue) {
    const Step step = held.poll.step;
    const uint64_t staleness = staleness_of(held.poll.variable);
    const StepTrack& track = tracks_[held.poll.variable.value];
    Error error = timed_out(fmt::format(
        "a poll of step {} of variable '{}' on shard {} waited {:.1f} s for worker(s) {} to push "
        "step {} (staleness {}){}",
        step, track.name(), settings_.id.value, seconds_between(held.since, now),
        fmt::join(track.behind(step, staleness), ", "), step.value - staleness, staleness,
        proceeds() ? "; answered without them" : ""));
    if (proceeds())
      file_held(held);
    else
      held.answer(error);
  }
}

void StepMachine::keep_short_handed(StepTrack& track) {
  for (ShortHanded& record : track.take_short_handed()) {
    ++short_handed_ranges_;
    if (short_handed_.size() == kShortHandedKept) short_handed_.pop_front();
    short_handed_.push_back(std::move(record));
  }
}

std::vector<ShortHanded> StepMachine::short_handed(size_t limit) const {
  size_t n = std::min(limit, short_handed_.size());
  return {short_handed_.end() - static_cast<ptrdiff_t>(n), short_handed_.end()};
}

void StepMachine::report(ShardStats& stats) const {
  stats.partitions_applied = pieces_applied_;
  stats.sync_timeouts = timeouts_;
  stats.pushes_late = late_pushes_;
  stats.polls_waiting = polls_.waiting();
  stats.polls_held = polls_held_;
  stats.pushes_held = pushes_held_;
  stats.joins = joins_;
  stats.leaves = leaves_;
  stats.short_handed_ranges = short_handed_ranges_;
  if (!has_members()) return;
  stats.members = members_.members();
  const Step newest = *std::max_element(pushed_.begin(), pushed_.end());
  for (uint32_t w = 0; w < settings_.workers; ++w)
    stats.workers.push_back({.worker = w,
                             .member = members_.is_member(WorkerId(w)),
                             .joined_at = members_.joined_at(WorkerId(w)),
                             .connections = leases_.connections(WorkerId(w)),
                             .pushed = pushed_[w],
                             .lag_steps = newest.value - pushed_[w].value});
}

void StepMachine::save(ByteWriter& out) const {
  members_.save(out);
  out.put(joins_);
  out.put(leaves_);
  out.put(short_handed_ranges_);
  out.put<uint64_t>(short_handed_.size());
  for (const ShortHanded& r : short_handed_) {
    out.text(r.variable);
    out.put(r.step.value);
    encode(out, r.range);
    out.put<uint64_t>(r.workers.size());
    for (uint32_t w : r.workers) out.put(w);
  }
}

void StepMachine::load(ByteReader& in) {
  members_.load(in);
  joins_ = in.get<uint64_t>();
  leaves_ = in.get<uint64_t>();
  short_handed_ranges_ = in.get<uint64_t>();
  uint64_t records = in.get<uint64_t>();
  if (records > kShortHandedKept)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} short-handed records, more than are kept",
         in.what(), records);
  for (uint64_t i = 0; i < records; ++i) {
    ShortHanded r{.variable = in.text(), .step = Step(in.get<uint64_t>())};
    r.range = decode_range(in);
    uint64_t workers = in.get<uint64_t>();
    if (workers > settings_.workers)
      fail(ErrorCode::corrupt_checkpoint, "{}: a short-handed record of {} workers", in.what(),
           workers);
    for (uint64_t w = 0; w < workers; ++w) r.workers.push_back(in.get<uint32_t>());
    short_handed_.push_back(std::move(r));
  }
}

void StepMachine::skip_saved(ByteReader& in, uint32_t workers) {
  Membership(workers, workers).load(in);
  for (int counter = 0; counter < 3; ++counter) in.get<uint64_t>();
  const uint64_t records = in.get<uint64_t>();
  if (records > kShortHandedKept)
    fail(ErrorCode::corrupt_checkpoint, "{}: {} short-handed records, more than are kept",
         in.what(), records);
  for (uint64_t i = 0; i < records; ++i) {
    in.text();
    in.get<uint64_t>();
    decode_range(in);
    const uint64_t gave = in.get<uint64_t>();
    if (gave > workers)
      fail(ErrorCode::corrupt_checkpoint, "{}: a short-handed record of {} workers", in.what(),
           gave);
    for (uint64_t w = 0; w < gave; ++w) in.get<uint32_t>();
  }
}

void StepMachine::load_track(VariableId id, ByteReader& in) {
  tracks_[id.value].load(in);
}

void StepMachine::replay_timeout(VariableId id, Step step, const std::string& record) {
  if (id.value >= tracks_.size() || mode_of(id) != Mode::sync)
    fail(ErrorCode::corrupt_checkpoint, "{}: a timeout of variable id {} that cannot be", record,
         id.value);
  StepTrack& track = tracks_[id.value];
  if (step != track.applied_step(kAllWorkers).next())
    fail(ErrorCode::corrupt_checkpoint, "{}: a timed-out step out of order", record);
  host_.apply_gathered(id, track.complete_without_missing());
}

void StepMachine::replay_join(WorkerId worker, Step from, const std::string& record,
                              Clock::time_point now) {
  if (!has_members() || worker.value >= settings_.workers || from == Step())
    fail(ErrorCode::corrupt_checkpoint, "{}: a join of worker {} at step {} that cannot be", record,
         worker.value, from);
  join_from(worker, from, now);
}

void StepMachine::replay_leave(WorkerId worker, const std::string& record, Clock::time_point now) {
  if (!has_members() || worker.value >= settings_.workers)
    fail(ErrorCode::corrupt_checkpoint, "{}: a leave of worker {} that cannot be", record,
         worker.value);
  leave(worker, "as logged", now);
}

}  // namespace psched
