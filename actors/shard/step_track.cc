// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/step_track.h"

#include <algorithm>

#include <fmt/format.h>

#include "actors/durability/state_codec.h"
#include "common/error.h"

namespace psched {

StepTrack::StepTrack(std::string name, ElementRange extent, Mode mode, uint32_t workers,
                     const Membership* members)
    : name_(std::move(name)), extent_(extent), mode_(mode), workers_(workers), members_(members) {
  sync_.received.resize(workers);
}

bool StepTrack::is_duplicate_given(WorkerId worker, Step step, ElementRange range, Step completed,
                                   const IntervalSet& received) const {
  if (step <= completed) return true;
  if (step > completed.next())
    fail(ErrorCode::step_from_future,
         "push to variable '{}' rejected: step {} from the future (next step is {})", name_, step,
         completed.next());
  if (received.contains(range)) return true;
  if (received.overlaps(range))
    fail(ErrorCode::stale_step,
         "push to variable '{}' rejected: elements [{}, {}) of step {} from worker {} were "
         "partly received already (a retry must resend the same partition)",
         name_, range.begin, range.end, step, worker.value);
  return false;
}

bool StepTrack::is_duplicate(WorkerId worker, Step step, ElementRange range) const {
  if (mode_ == Mode::sync) {
    if (worker.value >= workers_)
      fail(ErrorCode::invalid_argument,
           "push to variable '{}' rejected: worker {} is not below the job's {} workers", name_,
           worker.value, workers_);
    bool duplicate =
        is_duplicate_given(worker, step, range, sync_.completed, sync_.received[worker.value]);
    if (!expects(worker, step)) check_expected(worker, step);
    return duplicate;
  }
  if (members_ != nullptr && !members_->is_member(worker)) fail_not_a_member(worker, step);
  static const WorkerProgress kFresh;
  auto it = progress_.find(worker);
  const WorkerProgress& p = it == progress_.end() ? kFresh : it->second;
  return is_duplicate_given(worker, step, range, p.completed, p.received);
}

StepUpdate StepTrack::receive(WorkerId worker, Step step, ElementRange range) {
  if (mode_ == Mode::sync) return receive_sync(worker, step, range);
  return receive_async(worker, step, range);
}

StepUpdate StepTrack::receive_async(WorkerId worker, Step step, ElementRange range) {
  WorkerProgress& p = progress_[worker];
  if (p.t == 0) p.t = ++updates_;
  StepUpdate update{.step = step, .t = p.t, .pieces = {{range, 0, true}}};
  p.received.add(range);
  if (p.received.size() == extent_.size()) {
    p.completed = step;
    p.received.clear();
    p.t = 0;
    update.closes = true;
  }
  return update;
}

StepUpdate StepTrack::receive_sync(WorkerId worker, Step step, ElementRange range) {
  StepUpdate update{.step = step, .t = step.value, .gathered = true};
  update.pieces = coverage(range, worker, step);
  std::vector<StepPiece> applied;
  for (const StepPiece& piece : update.pieces) {
    if (!piece.complete) continue;
    note_contributors(step, {piece.range, piece.pushers + 1, true}, worker);
    applied.push_back(piece);
  }
  sync_.received[worker.value].add(range);
  update.closes = mark_applied(step, applied);
  return update;
}

bool StepTrack::mark_applied(Step step, const std::vector<StepPiece>& applied) {
  for (const StepPiece& piece : applied) sync_.applied.add(piece.range);
  if (sync_.applied.size() != extent_.size()) return false;
  sync_.completed = step;
  sync_.applied.clear();
  for (IntervalSet& received : sync_.received) received.clear();
  return true;
}

void StepTrack::note_contributors(Step step, const StepPiece& piece, WorkerId pusher) {
  if (members_ == nullptr || piece.pushers == workers_) return;
  ShortHanded record{.variable = name_, .step = step, .range = piece.range};
  for (uint32_t w = 0; w < workers_; ++w)
    if (w == pusher.value || sync_.received[w].contains(piece.range)) record.workers.push_back(w);
  short_handed_.push_back(std::move(record));
}

std::vector<StepPiece> StepTrack::coverage(ElementRange range, WorkerId except, Step step) const {
  std::vector<uint64_t> cuts{range.begin, range.end};
  for (uint32_t w = 0; w < sync_.received.size(); ++w) {
    if (w == except.value) continue;
    for (ElementRange r : sync_.received[w].ranges()) {
      if (range.begin < r.begin && r.begin < range.end) cuts.push_back(r.begin);
      if (range.begin < r.end && r.end < range.end) cuts.push_back(r.end);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<StepPiece> pieces;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    StepPiece piece{.range = {cuts[i], cuts[i + 1]}, .complete = quorum()};
    for (uint32_t w = 0; w < sync_.received.size(); ++w) {
      if (w == except.value) continue;
      if (sync_.received[w].contains(piece.range))
        ++piece.pushers;
      else if (expects(WorkerId(w), step))
        piece.complete = false;
    }
    pieces.push_back(piece);
  }
  return pieces;
}

bool StepTrack::expects(WorkerId worker, Step step) const {
  return members_ ? members_->expects(worker, step) : worker.value < workers_;
}

void StepTrack::fail_not_a_member(WorkerId worker, Step step) const {
  fail(ErrorCode::not_a_member,
       "push of step {} to variable '{}' rejected: worker {} is no member of the job (its "
       "lease ended or it never joined); join again (the client does on start)",
       step, name_, worker.value);
}

void StepTrack::check_expected(WorkerId worker, Step step) const {
  Step joined = members_->joined_at(worker);
  if (joined == Step() && step > sync_.completed) fail_not_a_member(worker, step);
  fail(ErrorCode::stale_step,
       "push of step {} to variable '{}' from worker {} dropped: the step {} without it ({})", step,
       name_, worker.value, step <= sync_.completed ? "closed" : "goes on",
       joined == Step() ? fmt::format("worker {} left the job", worker.value)
                        : fmt::format("worker {} joined at step {}", worker.value, joined));
}

IntervalSet StepTrack::not_yet_applied(WorkerId worker, Step step, ElementRange range) const {
  Step completed = applied_step(worker);
  IntervalSet pending;
  if (step <= completed) return pending;
  if (step > completed.next())
    fail(ErrorCode::step_from_future,
         "poll of variable '{}' rejected: step {} from the future (last complete step {})", name_,
         step, completed);
  pending.add(range);
  if (mode_ == Mode::sync) {
    for (ElementRange r : sync_.applied.ranges()) pending.subtract(r);
  } else if (auto it = progress_.find(worker); it != progress_.end()) {
    for (ElementRange r : it->second.received.ranges()) pending.subtract(r);
  }
  return pending;
}

bool StepTrack::between_steps() const {
  return !step_in_progress() &&
         std::all_of(progress_.begin(), progress_.end(),
                     [](const auto& worker) { return worker.second.received.empty(); });
}

bool StepTrack::step_in_progress() const {
  return std::any_of(sync_.received.begin(), sync_.received.end(),
                     [](const IntervalSet& r) { return !r.empty(); });
}

std::vector<uint32_t> StepTrack::missing_workers() const {
  std::vector<uint32_t> out;
  Step step = sync_.completed.next();
  for (uint32_t w = 0; w < sync_.received.size(); ++w)
    if (expects(WorkerId(w), step) && sync_.received[w].size() != extent_.size()) out.push_back(w);
  return out;
}

IntervalSet StepTrack::not_applied() const {
  IntervalSet open;
  open.add(extent_);
  for (ElementRange r : sync_.applied.ranges()) open.subtract(r);
  return open;
}

StepUpdate StepTrack::complete_without_missing() {
  Step step = sync_.completed.next();
  StepUpdate update{.step = step, .t = step.value, .gathered = true, .closes = true};
  const IntervalSet open = not_applied();
  for (ElementRange r : open.ranges()) {
    for (StepPiece piece : coverage(r, kAllWorkers, step)) {
      if (piece.pushers > 0) note_contributors(step, piece, kAllWorkers);
      piece.complete = true;
      update.pieces.push_back(piece);
    }
  }
  mark_applied(step, update.pieces);
  return update;
}

std::vector<StepUpdate> StepTrack::settle() {
  std::vector<StepUpdate> out;
  while (quorum()) {
    Step step = sync_.completed.next();
    StepUpdate update{.step = step, .t = step.value, .gathered = true};
    const IntervalSet open = not_applied();
    for (ElementRange r : open.ranges()) {
      for (const StepPiece& piece : coverage(r, kAllWorkers, step)) {
        if (!piece.complete) continue;
        if (piece.pushers > 0) note_contributors(step, piece, kAllWorkers);
        update.pieces.push_back(piece);
      }
    }
    if (update.pieces.empty()) break;
    update.closes = mark_applied(step, update.pieces);
    out.push_back(std::move(update));
    if (!out.back().closes) break;
  }
  return out;
}

std::vector<uint32_t> StepTrack::behind(Step step, uint64_t staleness) const {
  std::vector<uint32_t> out;
  if (step.value <= staleness) return out;
  Step needed(step.value - staleness);
  for (uint32_t w = 0; w < workers_; ++w) {
    if (!expects(WorkerId(w), needed)) continue;
    auto it = progress_.find(WorkerId(w));
    if (it == progress_.end() || it->second.completed < needed) out.push_back(w);
  }
  return out;
}

void StepTrack::skip_to(WorkerId worker, Step completed) {
  WorkerProgress& p = progress_[worker];
  if (p.completed >= completed) return;
  p = WorkerProgress{.completed = completed};
}

Step StepTrack::applied_step(WorkerId worker) const {
  if (mode_ == Mode::sync) return sync_.completed;
  auto it = progress_.find(worker);
  return it == progress_.end() ? Step() : it->second.completed;
}

Step StepTrack::latest_step() const {
  if (mode_ == Mode::sync) return sync_.completed;
  Step latest;
  for (const auto& [worker, progress] : progress_) latest = std::max(latest, progress.completed);
  return latest;
}

void StepTrack::save(ByteWriter& out) const {
  out.put(updates_);
  out.put<uint64_t>(progress_.size());
  for (const auto& [worker, p] : progress_) {
    out.put(worker.value);
    out.put(p.completed.value);
    out.put(p.t);
    encode(out, p.received);
  }
  out.put(sync_.completed.value);
  for (const IntervalSet& received : sync_.received) encode(out, received);
  encode(out, sync_.applied);
}

void StepTrack::load(ByteReader& in) {
  updates_ = in.get<uint64_t>();
  uint64_t progressing = in.get<uint64_t>();
  for (uint64_t i = 0; i < progressing; ++i) {
    WorkerId worker(in.get<uint32_t>());
    WorkerProgress& p = progress_[worker];
    p.completed = Step(in.get<uint64_t>());
    p.t = in.get<uint64_t>();
    p.received = decode_intervals(in);
  }
  sync_.completed = Step(in.get<uint64_t>());
  for (IntervalSet& received : sync_.received) received = decode_intervals(in);
  sync_.applied = decode_intervals(in);
}

}  // namespace psched
