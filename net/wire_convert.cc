// SPDX-License-Identifier: Apache-2.0
#include "net/wire_convert.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/ranges.h>

namespace psched {

wire::DType to_wire(DType dtype) {
  return dtype == DType::float32 ? wire::DType::FLOAT32 : wire::DType::FLOAT64;
}

wire::WireFormat to_wire(WireFormat format) {
  return static_cast<wire::WireFormat>(format);
}

WireFormat from_wire(wire::WireFormat format) {
  if (static_cast<unsigned>(format) > static_cast<unsigned>(WireFormat::onebit))
    fail(ErrorCode::invalid_argument, "unknown wire format number {}",
         static_cast<unsigned>(format));
  return static_cast<WireFormat>(format);
}

DType from_wire(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::FLOAT32:
      return DType::float32;
    case wire::DType::FLOAT64:
      return DType::float64;
  }
  fail(ErrorCode::dtype_mismatch, "unknown dtype number {} on the wire",
       static_cast<unsigned>(dtype));
}

wire::Mode to_wire(Mode mode) {
  switch (mode) {
    case Mode::sync:
      return wire::Mode::SYNC;
    case Mode::bounded:
      return wire::Mode::BOUNDED;
    default:
      return wire::Mode::ASYNC;
  }
}
Mode from_wire(wire::Mode mode) {
  switch (mode) {
    case wire::Mode::SYNC:
      return Mode::sync;
    case wire::Mode::BOUNDED:
      return Mode::bounded;
    default:
      return Mode::async;
  }
}

void to_wire(const optim::OptimizerSpec& s, wire::OptimizerSpec::Builder out) {
  std::string_view kind = optim::to_string(s.kind);
  out.setKind(capnp::Text::Reader(kind.data(), kind.size()));
#define PSCHED_SET_FIELD(field, Wire) out.set##Wire(s.field);
  PSCHED_OPTIMIZER_FIELDS(PSCHED_SET_FIELD)
#undef PSCHED_SET_FIELD
}

optim::OptimizerSpec from_wire(wire::OptimizerSpec::Reader in) {
  optim::OptimizerSpec s;
  std::string kind(in.getKind().cStr());
  if (!optim::parse_optimizer_kind(kind, s.kind))  // quotes a long kind's start only
    fail(ErrorCode::invalid_argument, "unknown optimizer '{}' ({} bytes)", kind.substr(0, 32),
         kind.size());
#define PSCHED_GET_FIELD(field, Wire) s.field = in.get##Wire();
  PSCHED_OPTIMIZER_FIELDS(PSCHED_GET_FIELD)
#undef PSCHED_GET_FIELD
  return s;
}

void to_wire(const VariableSpec& spec, bool use_server_optimizer, wire::VariableSpec::Builder out) {
  out.setName(spec.name);
  auto shape = out.initShape(static_cast<unsigned>(spec.shape.size()));
  for (unsigned i = 0; i < spec.shape.size(); ++i) shape.set(i, spec.shape[i]);
  out.setDtype(to_wire(spec.dtype));
  out.setPriority(spec.priority.value);
  to_wire(spec.optimizer, out.initOptimizer());
  out.setUseServerOptimizer(use_server_optimizer);
}

namespace {

// The shape, checked against the limit on dimensions and for a byte size that fits 64 bits.
std::vector<uint64_t> shape_from_wire(const std::string& name, capnp::List<uint64_t>::Reader in,
                                      uint64_t max_dims) {
  if (in.size() > max_dims)
    fail(ErrorCode::invalid_argument,
         "register of variable '{}' rejected: shape of {} dimensions is over the limit of {} "
         "(limits.max_shape_dims)",
         name, in.size(), max_dims);
  std::vector<uint64_t> shape;
  for (uint64_t d : in) shape.push_back(d);
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return shape;  // no elements
  constexpr uint64_t kMaxElements = UINT64_MAX / 8;  // whose bytes fit 64 bits in every dtype
  uint64_t elements = 1;
  for (uint64_t d : shape) {
    if (elements > kMaxElements / d)
      fail(ErrorCode::invalid_argument,
           "register of variable '{}' rejected: shape [{}] has more than {} elements", name,
           fmt::join(shape, ", "), kMaxElements);
    elements *= d;
  }
  return shape;
}

}  // namespace

VariableSpec from_wire(wire::VariableSpec::Reader in, const optim::OptimizerSpec& server_default,
                       const LimitsConfig& limits) {
  VariableSpec spec;
  auto name = in.getName();
  if (name.size() == 0) fail(ErrorCode::invalid_argument, "register rejected: empty variable name");
  if (name.size() > limits.max_name_bytes)
    fail(ErrorCode::invalid_argument,
         "register rejected: variable name of {} bytes is over the limit of {} "
         "(limits.max_name_bytes)",
         name.size(), limits.max_name_bytes);
  spec.name.assign(name.begin(), name.end());
  spec.shape = shape_from_wire(spec.name, in.getShape(), limits.max_shape_dims);
  spec.dtype = from_wire(in.getDtype());
  spec.priority = Priority(in.getPriority());
  spec.optimizer = in.getUseServerOptimizer() ? server_default : from_wire(in.getOptimizer());
  return spec;
}

namespace {

void to_wire(const optim::RowOptimizerSpec& s, wire::OptimizerSpec::Builder out) {
  std::string_view kind = optim::to_string(s.kind);
  out.setKind(capnp::Text::Reader(kind.data(), kind.size()));
  out.setLr(s.lr);
  out.setEps(s.eps);
  out.setBeta1(s.beta1);
  out.setBeta2(s.beta2);
  out.setLrDecay(s.lr_decay);
  out.setInitialAccumulatorValue(s.initial_accumulator_value);
  out.setWeightDecay(s.weight_decay);
  out.setMomentum(s.momentum);
}

optim::RowOptimizerSpec row_optimizer_from_wire(const std::string& table,
                                                wire::OptimizerSpec::Reader in) {
  optim::RowOptimizerSpec s;
  std::string kind(in.getKind().cStr());
  if (!optim::parse_row_optimizer_kind(kind, s.kind))
    fail(ErrorCode::invalid_argument,
         "register of table '{}' rejected: unknown row optimizer '{}' (sgd, adagrad, "
         "rowwise_adagrad or sparse_adam)",
         table, kind.substr(0, 32));
  s.lr = in.getLr();
  s.eps = in.getEps();
  s.beta1 = in.getBeta1();
  s.beta2 = in.getBeta2();
  s.lr_decay = in.getLrDecay();
  s.initial_accumulator_value = in.getInitialAccumulatorValue();
  s.weight_decay = in.getWeightDecay();
  s.momentum = in.getMomentum();
  return s;
}

RowInit init_from_wire(const std::string& table, wire::RowInit::Reader in) {
  const std::string_view kind(in.getKind().cStr(), in.getKind().size());
  RowInit init{.a = in.getA(), .b = in.getB()};
  if (!parse_row_init_kind(kind, init.kind))
    fail(ErrorCode::invalid_argument,
         "register of table '{}' rejected: unknown init '{}' (zeros, uniform or normal)", table,
         kind.substr(0, 32));
  return init;
}

}  // namespace

void to_wire(const TableSpec& spec, wire::TableSpec::Builder out) {
  out.setName(spec.name);
  out.setNumEmbeddings(spec.num_embeddings);
  out.setDim(spec.dim);
  out.setDtype(to_wire(spec.dtype));
  out.setPriority(spec.priority.value);
  to_wire(spec.optimizer, out.initOptimizer());
  auto init = out.initInit();
  const std::string_view kind = to_string(spec.init.kind);
  init.setKind(capnp::Text::Reader(kind.data(), kind.size()));
  init.setA(spec.init.a);
  init.setB(spec.init.b);
  out.setSeed(spec.seed);
  out.setMaxRows(spec.max_rows);
  out.setAdmitAfter(spec.admit_after);
}

TableSpec from_wire(wire::TableSpec::Reader in, const LimitsConfig& limits) {
  TableSpec spec;
  auto name = in.getName();
  if (name.size() == 0) fail(ErrorCode::invalid_argument, "register rejected: empty table name");
  if (name.size() > limits.max_name_bytes)
    fail(ErrorCode::invalid_argument,
         "register rejected: table name of {} bytes is over the limit of {} "
         "(limits.max_name_bytes)",
         name.size(), limits.max_name_bytes);
  spec.name.assign(name.begin(), name.end());
  spec.num_embeddings = in.getNumEmbeddings();
  spec.dim = in.getDim();
  spec.dtype = from_wire(in.getDtype());
  spec.priority = Priority(in.getPriority());
  spec.optimizer = row_optimizer_from_wire(spec.name, in.getOptimizer());
  spec.init = init_from_wire(spec.name, in.getInit());
  spec.seed = in.getSeed();
  spec.max_rows = in.getMaxRows();
  spec.admit_after = in.getAdmitAfter();
  return spec;
}

}  // namespace psched
