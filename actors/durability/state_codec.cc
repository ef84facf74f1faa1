// SPDX-License-Identifier: Apache-2.0
#include "actors/durability/state_codec.h"

#include <string_view>
#include <type_traits>

namespace psched {
namespace {

using optim::OptimizerSpec;

// The kind, then the hyper-parameters (optim/optimizer.h's list): the numbers in the list's
// order, then the flags, one byte each.
void encode(ByteWriter& out, const OptimizerSpec& o) {
  out.put<uint8_t>(static_cast<uint8_t>(o.kind));
  optim::for_each_hyperparameter([&](std::string_view, auto member) {
    if constexpr (std::is_same_v<decltype(member), double OptimizerSpec::*>) out.put(o.*member);
  });
  optim::for_each_hyperparameter([&](std::string_view, auto member) {
    if constexpr (std::is_same_v<decltype(member), bool OptimizerSpec::*>)
      out.put<uint8_t>(o.*member);
  });
}

OptimizerSpec decode_optimizer(ByteReader& in) {
  OptimizerSpec o;
  auto kind = in.get<uint8_t>();
  if (kind > static_cast<uint8_t>(optim::OptimizerKind::rmsprop))
    fail(ErrorCode::corrupt_checkpoint, "{}: unknown optimizer kind {} at byte {}", in.what(), kind,
         in.position());
  o.kind = static_cast<optim::OptimizerKind>(kind);
  optim::for_each_hyperparameter([&](std::string_view, auto member) {
    if constexpr (std::is_same_v<decltype(member), double OptimizerSpec::*>)
      o.*member = in.get<double>();
  });
  optim::for_each_hyperparameter([&](std::string_view, auto member) {
    if constexpr (std::is_same_v<decltype(member), bool OptimizerSpec::*>)
      o.*member = in.get<uint8_t>() != 0;
  });
  return o;
}

}  // namespace

void encode(ByteWriter& out, const VariableSpec& spec) {
  out.text(spec.name);
  out.put<uint64_t>(spec.shape.size());
  for (uint64_t d : spec.shape) out.put(d);
  out.put<uint8_t>(static_cast<uint8_t>(spec.dtype));
  out.put(spec.priority.value);
  encode(out, spec.optimizer);
}

VariableSpec decode_spec(ByteReader& in) {
  VariableSpec spec;
  spec.name = in.text();
  uint64_t dims = in.get<uint64_t>();
  for (uint64_t i = 0; i < dims; ++i) spec.shape.push_back(in.get<uint64_t>());
  auto dtype = in.get<uint8_t>();
  if (dtype > static_cast<uint8_t>(DType::float64))
    fail(ErrorCode::corrupt_checkpoint, "{}: unknown dtype {} for variable '{}'", in.what(), dtype,
         spec.name);
  spec.dtype = static_cast<DType>(dtype);
  spec.priority = Priority(in.get<int64_t>());
  spec.optimizer = decode_optimizer(in);
  return spec;
}

void encode_table_spec(ByteWriter& out, const TableSpec& spec) {
  out.text(spec.name);
  out.put(spec.num_embeddings);
  out.put(spec.dim);
  out.put<uint8_t>(static_cast<uint8_t>(spec.dtype));
  out.put(spec.priority.value);
  const optim::RowOptimizerSpec& o = spec.optimizer;
  out.put<uint8_t>(static_cast<uint8_t>(o.kind));
  for (double x : {o.lr, o.eps, o.beta1, o.beta2, o.lr_decay, o.initial_accumulator_value,
                   o.weight_decay, o.momentum})
    out.put(x);
  out.put<uint8_t>(static_cast<uint8_t>(spec.init.kind));
  out.put(spec.init.a);
  out.put(spec.init.b);
  out.put(spec.seed);
  out.put(spec.max_rows);
  out.put(spec.admit_after);
}

TableSpec decode_table_spec(ByteReader& in) {
  TableSpec spec{.name = in.text()};
  spec.num_embeddings = in.get<uint64_t>();
  spec.dim = in.get<uint32_t>();
  const auto dtype = in.get<uint8_t>();
  spec.priority = Priority(in.get<int64_t>());
  const auto kind = in.get<uint8_t>();
  optim::RowOptimizerSpec& o = spec.optimizer;
  for (double* x : {&o.lr, &o.eps, &o.beta1, &o.beta2, &o.lr_decay, &o.initial_accumulator_value,
                    &o.weight_decay, &o.momentum})
    *x = in.get<double>();
  const auto init = in.get<uint8_t>();
  spec.init.a = in.get<double>();
  spec.init.b = in.get<double>();
  spec.seed = in.get<uint64_t>();
  spec.max_rows = in.get<uint64_t>();
  spec.admit_after = in.get<uint32_t>();
  if (dtype > static_cast<uint8_t>(DType::float64) ||
      kind > static_cast<uint8_t>(optim::RowOptimizerKind::sparse_adam) ||
      init > static_cast<uint8_t>(RowInit::Kind::normal))
    fail(ErrorCode::corrupt_checkpoint, "{}: table '{}' has dtype {}, optimizer {}, init {}",
         in.what(), spec.name, dtype, kind, init);
  spec.dtype = static_cast<DType>(dtype);
  o.kind = static_cast<optim::RowOptimizerKind>(kind);
  spec.init.kind = static_cast<RowInit::Kind>(init);
  return spec;
}

void encode(ByteWriter& out, ElementRange range) {
  out.put(range.begin);
  out.put(range.end);
}

ElementRange decode_range(ByteReader& in) {
  ElementRange r{in.get<uint64_t>(), 0};
  r.end = in.get<uint64_t>();
  if (r.end < r.begin)
    fail(ErrorCode::corrupt_checkpoint, "{}: range [{}, {}) ends before it begins at byte {}",
         in.what(), r.begin, r.end, in.position());
  return r;
}

void encode(ByteWriter& out, const IntervalSet& set) {
  auto ranges = set.ranges();
  out.put<uint64_t>(ranges.size());
  for (ElementRange r : ranges) encode(out, r);
}

IntervalSet decode_intervals(ByteReader& in) {
  IntervalSet set;
  uint64_t n = in.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) set.add(decode_range(in));
  return set;
}

}  // namespace psched
