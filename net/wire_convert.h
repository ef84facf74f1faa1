// SPDX-License-Identifier: Apache-2.0
// Conversions between the wire types of psched.capnp and psched's C++ types (errors:
// common/kj_error.h).
#pragma once

#include <exception>

#include "actors/shard/table_spec.h"
#include "actors/shard/variable_spec.h"
#include "common/error.h"
#include "common/kj_error.h"
#include "compression/wire_format.h"
#include "config/deployment.h"
#include "net/psched.capnp.h"

namespace psched {

wire::DType to_wire(DType dtype);
DType from_wire(wire::DType dtype);
wire::WireFormat to_wire(WireFormat format);
// Throws Error(invalid_argument) for a format number psched does not know.
WireFormat from_wire(wire::WireFormat format);
wire::Mode to_wire(Mode mode);
Mode from_wire(wire::Mode mode);

void to_wire(const optim::OptimizerSpec& spec, wire::OptimizerSpec::Builder out);
// Throws Error(invalid_argument) for an unknown optimizer kind.
optim::OptimizerSpec from_wire(wire::OptimizerSpec::Reader in);

// `spec.optimizer` is sent; `use_server_optimizer` tells the shard to ignore it.
void to_wire(const VariableSpec& spec, bool use_server_optimizer, wire::VariableSpec::Builder out);
// A server-side read; `server_default` replaces the optimizer when the spec asks for it.
// Throws Error on a malformed spec (bad name, dtype, optimizer), one over `limits` (name bytes,
// shape dimensions) or one whose size in bytes does not fit 64 bits.
VariableSpec from_wire(wire::VariableSpec::Reader in, const optim::OptimizerSpec& server_default,
                       const LimitsConfig& limits);

// A table's spec both ways: the row optimizer travels in an OptimizerSpec, its kind one of
// optim::RowOptimizerKind's names. from_wire throws Error naming what is wrong: an empty or too
// long name, an unknown optimizer or init kind (a spec's values are checked by the shard,
// RowTable::check_spec).
void to_wire(const TableSpec& spec, wire::TableSpec::Builder out);
TableSpec from_wire(wire::TableSpec::Reader in, const LimitsConfig& limits);

}  // namespace psched
