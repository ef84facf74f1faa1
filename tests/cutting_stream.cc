// SPDX-License-Identifier: Apache-2.0
#include "tests/cutting_stream.h"

#include <algorithm>

#include <kj/debug.h>

namespace psched::testing {
namespace {

kj::Exception lost() {
  return KJ_EXCEPTION(DISCONNECTED, "connection cut by the test");
}

}  // namespace

kj::Promise<void> CuttingStream::write(const void* buffer, size_t size) {
  if (cut_) return lost();
  if (size < plan_->bytes_left) {
    if (plan_->bytes_left != CutPlan::kNever) plan_->bytes_left -= size;
    return inner_->write(buffer, size);
  }
  size_t allowed = plan_->bytes_left;
  plan_->bytes_left = CutPlan::kNever;
  ++plan_->cuts;
  cut_ = true;
  return inner_->write(buffer, allowed).then([this]() -> kj::Promise<void> {
    inner_->shutdownWrite();
    return lost();
  });
}

kj::Promise<void> CuttingStream::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  if (cut_) return lost();
  size_t total = 0;
  for (auto piece : pieces) total += piece.size();
  if (total < plan_->bytes_left) {
    if (plan_->bytes_left != CutPlan::kNever) plan_->bytes_left -= total;
    return inner_->write(pieces);
  }
  // The cut falls in this write: send the pieces one by one up to it.
  auto flat = kj::heapArray<kj::byte>(total);
  size_t at = 0;
  for (auto piece : pieces) {
    std::copy(piece.begin(), piece.end(), flat.begin() + at);
    at += piece.size();
  }
  auto promise = write(flat.begin(), flat.size());
  return promise.attach(kj::mv(flat));
}

}  // namespace psched::testing
