// SPDX-License-Identifier: Apache-2.0
// How a variable's numbers travel: the format of a push's gradient and of a fresh value on the
// wire, chosen per variable by the worker (the deployment's `compression:` section is the
// default, a trainer may choose per variable) and named in every request, so a shard needs no
// state to read it and one shard serves workers of mixed formats. The shard keeps values and
// optimizer state in the variable's dtype whatever the wire carries (compression/codec.h).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace psched {

enum class WireFormat : uint8_t {
  none,    ///< the variable's dtype, as it is
  bf16,    ///< bfloat16: the dtype's exponent range, 8 bits of precision (push and values)
  fp16,    ///< IEEE binary16: 11 bits of precision, finite up to 65504 (push and values)
  topk,    ///< pushes: the largest magnitudes of a partition, as index and value; pulls: deltas
  onebit,  ///< pushes: the signs of a partition and one scale, its mean magnitude
};

// Every format, in the wire's order.
inline constexpr std::array<WireFormat, 5> kWireFormats = {
    WireFormat::none, WireFormat::bf16, WireFormat::fp16, WireFormat::topk, WireFormat::onebit};

constexpr std::string_view to_string(WireFormat format) {
  switch (format) {
    case WireFormat::none:
      return "none";
    case WireFormat::bf16:
      return "bf16";
    case WireFormat::fp16:
      return "fp16";
    case WireFormat::topk:
      return "topk";
    case WireFormat::onebit:
      return "onebit";
  }
  return "unknown";
}

// The format named `name` ("none", "bf16", ...); false when none is.
constexpr bool parse_wire_format(std::string_view name, WireFormat& out) {
  for (WireFormat f : kWireFormats) {
    if (to_string(f) == name) {
      out = f;
      return true;
    }
  }
  return false;
}

// Whether fresh values may travel in `format` (the sparse formats are for gradients only:
// a value must arrive whole).
constexpr bool carries_values(WireFormat format) {
  return format == WireFormat::none || format == WireFormat::bf16 || format == WireFormat::fp16;
}

// Whether fresh values may be asked for in `format`: whole (carries_values()), or as topk
// deltas of them (Compression::pull).
constexpr bool carries_pulls(WireFormat format) {
  return carries_values(format) || format == WireFormat::topk;
}

// Whether any format is a push's (each is).
constexpr bool carries_pushes(WireFormat) {
  return true;
}

// Whether `format` drops part of each gradient, so the worker keeps what it did not send and
// adds it to the next step's (error feedback, compression/error_feedback.h).
constexpr bool needs_feedback(WireFormat format) {
  return format == WireFormat::topk || format == WireFormat::onebit;
}

// How many of a partition's elements a topk push sends.
struct TopK {
  double fraction = 0.01;  // of the partition's elements, rounded up
  uint64_t count = 0;      // when not 0: this many, whatever the fraction
  // For a partition of `elements` (at least one is sent, at most all).
  uint64_t of(uint64_t elements) const;
  // Whether `f` can be a fraction: in (0, 1].
  static constexpr bool is_fraction(double f) { return f > 0 && f <= 1; }
  bool operator==(const TopK&) const = default;
};

// A variable's compression, both directions. The deployment's `compression:` section is the
// default for every variable; a trainer may give another per variable.
//
// `pull: topk` asks for deltas (actors/shard/value_deltas.h): the shard answers a worker's poll
// with the elements whose published value changed most since the version the worker holds
// (at most pull_fraction of a partition), keeping the rest of each change on the shard for
// later; full values in `pull_full` when the worker holds none the shard can answer from.
struct Compression {
  WireFormat push = WireFormat::none;
  WireFormat pull = WireFormat::none;  // of fresh values: carries_values(), or topk (deltas)
  TopK topk;
  // Variables smaller than this travel uncompressed both ways (narrowing a small tensor saves
  // less than it costs). An embedding table is compared by its size, num_embeddings rows of
  // its row bytes, never by a request's (TableStepper; docs/compression.md, "Tables").
  uint64_t min_bytes = 64 * 1024;
  // Steps below this push uncompressed, and pull full values (the first updates are the
  // largest and least alike; under an adaptive optimizer they estimate the variance topk
  // pushes are applied with).
  uint64_t warmup_steps = 0;
  // pull: topk. The share of a partition's elements a delta sends at most, rounded up.
  double pull_fraction = 0.01;
  // pull: topk. The deltas a shard keeps per partition: a worker this many versions behind is
  // sent their union, one further behind full values.
  uint16_t ring = 4;
  // pull: topk. Every this many steps the worker asks for full values (0: only when it must).
  uint64_t refresh_steps = 0;
  // pull: topk. Full values travel in this (none, bf16 or fp16).
  WireFormat pull_full = WireFormat::none;

  // The push format of `step` of a variable of `bytes`.
  WireFormat push_at(uint64_t step, uint64_t bytes) const {
    return step < warmup_steps || bytes < min_bytes ? WireFormat::none : push;
  }
  // The format full values of a variable of `bytes` come back in.
  WireFormat pull_for(uint64_t bytes) const {
    if (bytes < min_bytes) return WireFormat::none;
    return pull == WireFormat::topk ? pull_full : pull;
  }
  // Whether the poll of `step` of a variable of `bytes` asks for a delta.
  bool deltas_at(uint64_t step, uint64_t bytes) const {
    return pull == WireFormat::topk && bytes >= min_bytes && step >= warmup_steps;
  }
  // Whether the poll of `step` asks for full values though it could have a delta.
  bool refresh_at(uint64_t step) const { return refresh_steps != 0 && step % refresh_steps == 0; }
  // The most elements a delta of a partition of `elements` sends.
  uint64_t delta_count(uint64_t elements) const {
    return TopK{.fraction = pull_fraction}.of(elements);
  }

  // What an embedding table's rows take of this setting when it is given for every variable (a
  // model's compression=, the deployment's compression:) rather than for the table: rows carry
  // whole values both ways, so a push that drops part of each gradient (topk, onebit) goes
  // whole (none), and a pull of deltas (topk) asks for full values in pull_full, as a delta
  // pull's whole answers travel. The thresholds (min_bytes, warmup_steps) stay.
  constexpr Compression for_rows() const {
    Compression rows = *this;
    if (!carries_values(rows.push)) rows.push = WireFormat::none;
    if (rows.pull == WireFormat::topk) rows.pull = pull_full;
    return rows;
  }

  bool operator==(const Compression&) const = default;
};

}  // namespace psched
