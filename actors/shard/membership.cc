// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/membership.h"

#include "common/check.h"
#include "common/error.h"

namespace psched {

Membership::Membership(uint32_t workers, uint32_t min_workers)
    : joined_(workers, Seat{.from = Step(1)}), min_workers_(min_workers), members_(workers) {
  PSCHED_REQUIRE(min_workers >= 1 && min_workers <= workers, min_workers, workers);
}

void Membership::join(WorkerId worker, Step from) {
  PSCHED_REQUIRE(worker.value < joined_.size() && from != Step(), worker.value, from.value);
  if (!is_member(worker)) ++members_;
  joined_[worker.value] = Seat{.from = from};
}

void Membership::leave(WorkerId worker) {
  if (!is_member(worker)) return;
  joined_[worker.value] = Seat{};
  --members_;
}

void Membership::pushed(WorkerId worker) {
  if (is_member(worker)) joined_[worker.value].pushed = true;
}

void Membership::save(ByteWriter& out) const {
  out.put<uint32_t>(workers());
  for (const Seat& seat : joined_) {
    out.put(seat.from.value);
    out.put<uint8_t>(seat.pushed ? 1 : 0);
  }
}

void Membership::load(ByteReader& in) {
  uint32_t workers = in.get<uint32_t>();
  if (workers != joined_.size())
    fail(ErrorCode::corrupt_checkpoint, "{}: membership of {} workers where the job has {}",
         in.what(), workers, joined_.size());
  members_ = 0;
  for (Seat& seat : joined_) {
    seat.from = Step(in.get<uint64_t>());
    seat.pushed = in.get<uint8_t>() != 0;
    if (seat.from != Step()) ++members_;
  }
}

}  // namespace psched
