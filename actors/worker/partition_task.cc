// SPDX-License-Identifier: Apache-2.0
#include "actors/worker/partition_task.h"

#include <algorithm>

#include <fmt/format.h>

#include "compression/codec.h"

namespace psched {

size_t Landing::wire_bytes() const {
  return encoded_bytes(format, dtype, elements);
}

namespace {

// The value's rows (`value`, in `format`) decoded into their places: row k at landing.row_out(k).
void land_rows(const Landing& landing, WireFormat format, std::span<const std::byte> value) {
  const size_t wire_row = encoded_bytes(format, landing.dtype, landing.row_elements);
  for (size_t k = 0; k < landing.rows_at.size(); ++k)
    decode(format, landing.dtype, value.subspan(k * wire_row, wire_row),
           {landing.row_out(k), landing.row_bytes()});
}

}  // namespace

Result<> Landing::land(std::span<const std::byte> value, WireFormat answered,
                       uint64_t answered_version) const {
  if (!takes(answered))
    return Error(ErrorCode::invalid_argument,
                 fmt::format("shard answered in {} where {} was asked for", to_string(answered),
                             to_string(format)));
  if (answered == WireFormat::topk) {
    try {
      apply_delta(dtype, value, {out, bytes()});
    } catch (const Error& e) {
      return e;
    }
  } else {
    if (value.size() != wire_bytes())
      return Error(ErrorCode::shape_mismatch,
                   fmt::format("shard answered {} bytes where {} were expected", value.size(),
                               wire_bytes()));
    if (rows_at.empty())
      decode(format, dtype, value, {out, bytes()});
    else
      land_rows(*this, format, value);
  }
  if (version != nullptr) *version = answered_version;
  return {};
}

uint64_t PartitionTask::bytes() const {
  if (const auto* rows = std::get_if<RowsRequest>(&request)) return rows->wire_bytes();
  return partition().gradient.size();
}

uint64_t PartitionTask::push_bytes() const {
  if (const auto* rows = std::get_if<RowsRequest>(&request)) return rows->push ? bytes() : 0;
  return partition().gradient.size();
}

uint64_t PartitionTask::pull_bytes() const {
  if (const auto* rows = std::get_if<RowsRequest>(&request)) return rows->push ? 0 : bytes();
  const PartitionRequest& dense = partition();
  if (dense.delta.version != nullptr && !dense.delta.refresh)  // a delta, as a rule
    return std::min<uint64_t>(encoded_bytes(WireFormat::topk, dense.dtype, dense.delta.count),
                              dense.landing().wire_bytes());
  return dense.landing().wire_bytes();
}

WireFormat PartitionTask::format() const {
  return std::visit([](const auto& r) { return r.format; }, request);
}

WireFormat PartitionTask::value_format() const {
  return std::visit([](const auto& r) { return r.value_format; }, request);
}

ElementRange PartitionTask::range() const {
  if (const auto* rows = std::get_if<RowsRequest>(&request)) return {0, rows->ids.size()};
  return partition().range;
}

}  // namespace psched
