// SPDX-License-Identifier: Apache-2.0
#include "compression/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>

#include "common/check.h"
#include "common/error.h"
#include "compression/half.h"

namespace psched {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire is little-endian");

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void store(std::byte* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

template <typename T>
std::span<const T> typed(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
}

template <typename T>
std::span<T> typed(std::span<std::byte> bytes) {
  return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
}

template <typename T, uint16_t (*narrow)(float)>
void encode_16(std::span<const T> values, std::byte* out) {
  for (size_t i = 0; i < values.size(); ++i)
    store(out + 2 * i, narrow(static_cast<float>(values[i])));
}

template <typename T, float (*widen)(uint16_t)>
void decode_16(const std::byte* body, std::span<T> out) {
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<T>(widen(load<uint16_t>(body + 2 * i)));
}

// Top-k's working memory, reused by each thread's encodes (a worker's loop, a shard's).
template <typename T>
struct TopKScratch {
  std::vector<T> magnitudes;
  std::vector<uint32_t> candidates;
};

template <typename T>
TopKScratch<T>& topk_scratch() {
  thread_local TopKScratch<T> scratch;
  return scratch;
}

// The sample a threshold is estimated from: every (n / kTopKSample)-th element, for partitions
// of at least kTopKSampled elements (smaller ones are selected exactly).
constexpr uint64_t kTopKSample = 1024;
constexpr uint64_t kTopKSampled = 16 * kTopKSample;

// A magnitude that somewhat more than k of `values` reach, estimated from a sample as Deep
// Gradient Compression does (Lin et al., ICLR 2018): the sample's quantile for 1.5 k plus four
// standard deviations of that estimate, so that fewer than k reach it about never. Nothing
// where the partition is too small to sample or k too large a part of it.
// `value(i)` is element i of the n.
template <typename T, typename Value>
std::optional<T> sampled_threshold(uint64_t n, const Value& value, uint64_t k,
                                   std::vector<T>& sample) {
  if (n < kTopKSampled) return std::nullopt;
  const double p = static_cast<double>(k) / static_cast<double>(n);
  const double wanted = 1.5 * p + 4 * std::sqrt(p / kTopKSample);
  const auto reach = static_cast<uint64_t>(std::ceil(wanted * kTopKSample));
  if (reach * 2 >= kTopKSample) return std::nullopt;
  sample.resize(kTopKSample);
  for (uint64_t i = 0; i < kTopKSample; ++i) sample[i] = std::abs(value(i * n / kTopKSample));
  const auto at = sample.begin() + static_cast<ptrdiff_t>(kTopKSample - reach);
  std::nth_element(sample.begin(), at, sample.end());
  return *at;
}

// Writes the k elements at `candidates` (ascending indices holding every element of the k
// largest magnitudes) with the largest magnitudes, ties to the lower index, into `indices` and
// `kept`, ascending: `magnitude(i)` is element i's magnitude, `value(i)` what is kept of it.
// `magnitudes` is working memory.
template <typename T, typename Magnitude, typename Value>
void select_topk(std::span<const uint32_t> candidates, uint64_t k, const Magnitude& magnitude,
                 const Value& value, std::vector<T>& magnitudes, std::byte* indices,
                 std::byte* kept) {
  magnitudes.resize(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) magnitudes[c] = magnitude(candidates[c]);
  const auto at = magnitudes.begin() + static_cast<ptrdiff_t>(candidates.size() - k);
  std::nth_element(magnitudes.begin(), at, magnitudes.end());
  const T threshold = *at;
  uint64_t above = 0;
  for (auto m = at + 1; m != magnitudes.end(); ++m) above += *m > threshold;
  uint64_t ties = k - above;  // of those equal to the threshold, the first in index order
  uint64_t written = 0;
  for (uint32_t i : candidates) {
    const T m = magnitude(i);
    bool take = m > threshold;
    if (!take && m == threshold && ties > 0) {
      take = true;
      --ties;
    }
    if (take) {
      store(indices + 4 * written, i);
      store(kept + sizeof(T) * written, value(i));
      if (++written == k) return;
    }
  }
}

// The k largest magnitudes of `values`, ties to the lower index, as a topk body. Candidates:
// the elements that reach a sampled threshold (one pass, no copy of the partition), or, where
// that found fewer than k or the partition is too small to sample, every element. V is const
// T, or T for error feedback: `added` (a gradient) is added into `values` (the residual) in the
// same pass, and the elements sent are zeroed in it after (each is sent whole).
template <typename T, typename V>
void encode_topk(std::span<V> values, std::span<const T> added, const TopK& topk,
                 std::vector<std::byte>& body) {
  constexpr bool kAdding = !std::is_const_v<V>;
  const uint64_t n = values.size();
  const uint64_t k = topk.of(n);
  body.resize(8 + k * (4 + sizeof(T)));
  store(body.data(), static_cast<uint32_t>(n));
  store(body.data() + 4, static_cast<uint32_t>(k));
  TopKScratch<T>& scratch = topk_scratch<T>();
  std::vector<uint32_t>& candidates = scratch.candidates;
  candidates.clear();
  auto sum = [&](uint64_t i) -> T {
    if constexpr (kAdding) return values[i] + added[i];
    return values[i];
  };
  std::optional<T> reach;
  if (k > 0) reach = sampled_threshold<T>(n, sum, k, scratch.magnitudes);
  if (reach) {
    for (uint64_t i = 0; i < n; ++i) {
      if constexpr (kAdding) values[i] += added[i];
      if (std::abs(values[i]) >= *reach) candidates.push_back(static_cast<uint32_t>(i));
    }
  } else if constexpr (kAdding) {
    for (uint64_t i = 0; i < n; ++i) values[i] += added[i];
  }
  if (k == 0) return;
  if (candidates.size() < k) {
    candidates.resize(n);
    std::iota(candidates.begin(), candidates.end(), uint32_t{0});
  }
  std::byte* indices = body.data() + 8;
  auto element = [&](uint32_t i) -> T { return values[i]; };
  auto magnitude = [&](uint32_t i) -> T { return std::abs(values[i]); };
  select_topk<T>(std::span<const uint32_t>(candidates), k, magnitude, element, scratch.magnitudes,
                 indices, indices + 4 * k);
  if constexpr (kAdding)
    for (uint64_t i = 0; i < k; ++i) values[load<uint32_t>(indices + 4 * i)] = T(0);
}

// Writes a topk (or delta) body's values into `out` at its indices, leaving the rest.
template <typename T>
void scatter_kept(std::span<const std::byte> body, std::span<T> out) {
  const uint32_t k = load<uint32_t>(body.data() + 4);
  const std::byte* indices = body.data() + 8;
  const std::byte* kept = indices + 4 * uint64_t{k};
  for (uint64_t i = 0; i < k; ++i)
    out[load<uint32_t>(indices + 4 * i)] = load<T>(kept + sizeof(T) * i);
}

template <typename T>
void decode_topk(std::span<const std::byte> body, std::span<T> out) {
  std::fill(out.begin(), out.end(), T(0));
  scatter_kept(body, out);
}

// The elements `indices` of `values` as a delta body.
template <typename T>
void encode_delta_at(std::span<const T> values, std::span<const uint32_t> indices,
                     std::vector<std::byte>& body) {
  body.resize(8 + indices.size() * (4 + sizeof(T)));
  store(body.data(), static_cast<uint32_t>(values.size()));
  store(body.data() + 4, static_cast<uint32_t>(indices.size()));
  std::byte* kept = body.data() + 8 + 4 * indices.size();
  for (size_t c = 0; c < indices.size(); ++c) {
    store(body.data() + 8 + 4 * c, indices[c]);
    store(kept + sizeof(T) * c, values[indices[c]]);
  }
}

// encode_delta's selection: the at most k elements where `current` and `published` differ
// most, ties to the lower index, with their current values; copies them into `published`.
template <typename T>
void encode_delta(std::span<const T> current, std::span<T> published, uint64_t k,
                  std::vector<std::byte>& body, std::vector<uint32_t>& sent) {
  const uint64_t n = current.size();
  auto difference = [&](uint64_t i) -> T { return current[i] - published[i]; };
  auto magnitude = [&](uint32_t i) -> T { return std::abs(current[i] - published[i]); };
  auto element = [&](uint32_t i) -> T { return current[i]; };
  TopKScratch<T>& scratch = topk_scratch<T>();
  std::vector<uint32_t>& candidates = scratch.candidates;
  candidates.clear();
  std::optional<T> reach;
  if (k > 0) reach = sampled_threshold<T>(n, difference, k, scratch.magnitudes);
  if (reach)
    for (uint64_t i = 0; i < n; ++i) {
      const T m = magnitude(static_cast<uint32_t>(i));
      if (m >= *reach && m > T(0)) candidates.push_back(static_cast<uint32_t>(i));
    }
  if (!reach || candidates.size() < k) {
    candidates.clear();
    for (uint64_t i = 0; i < n; ++i)
      if (current[i] != published[i]) candidates.push_back(static_cast<uint32_t>(i));
  }
  if (candidates.size() <= k) {  // every element that changed
    sent.assign(candidates.begin(), candidates.end());
    encode_delta_at<T>(current, sent, body);
  } else {
    body.resize(8 + k * (4 + sizeof(T)));
    store(body.data(), static_cast<uint32_t>(n));
    store(body.data() + 4, static_cast<uint32_t>(k));
    select_topk<T>(std::span<const uint32_t>(candidates), k, magnitude, element, scratch.magnitudes,
                   body.data() + 8, body.data() + 8 + 4 * k);
    sent.resize(k);
    for (uint64_t c = 0; c < k; ++c) sent[c] = load<uint32_t>(body.data() + 8 + 4 * c);
  }
  for (uint32_t i : sent) published[i] = current[i];
}

template <typename T>
void encode_onebit(std::span<const T> values, std::vector<std::byte>& body) {
  const uint64_t n = values.size();
  T magnitude = 0;
  for (T v : values) magnitude += std::abs(v);
  const T scale = n == 0 ? T(0) : magnitude / static_cast<T>(n);
  body.assign(4 + sizeof(T) + (n + 7) / 8, std::byte{0});
  store(body.data(), static_cast<uint32_t>(n));
  store(body.data() + 4, scale);
  std::byte* signs = body.data() + 4 + sizeof(T);
  for (uint64_t i = 0; i < n; ++i)
    if (std::signbit(values[i])) signs[i / 8] |= std::byte{1} << (i % 8);
}

template <typename T>
void decode_onebit(std::span<const std::byte> body, std::span<T> out) {
  const T scale = load<T>(body.data() + 4);
  const std::byte* signs = body.data() + 4 + sizeof(T);
  for (uint64_t i = 0; i < out.size(); ++i) {
    bool negative = (signs[i / 8] & (std::byte{1} << (i % 8))) != std::byte{0};
    out[i] = negative ? -scale : scale;
  }
}

// `what`: the push, or a delta of values.
[[noreturn]] void malformed(WireFormat format, std::string_view why,
                            std::string_view what = "push") {
  fail(ErrorCode::invalid_argument, "malformed {} {}: {}", to_string(format), what, why);
}

uint64_t topk_elements(DType dtype, std::span<const std::byte> body,
                       std::string_view what = "push") {
  if (body.size() < 8)
    malformed(WireFormat::topk, fmt::format("{} bytes, under the 8 of its counts", body.size()),
              what);
  const uint64_t n = load<uint32_t>(body.data());
  const uint64_t k = load<uint32_t>(body.data() + 4);
  const uint64_t expected = 8 + k * (4 + element_bytes(dtype));
  if (body.size() != expected)
    malformed(WireFormat::topk,
              fmt::format("{} bytes where {} values of {} take {}", body.size(), k,
                          to_string(dtype), expected),
              what);
  if (k > n) malformed(WireFormat::topk, fmt::format("{} values for {} elements", k, n), what);
  const std::byte* indices = body.data() + 8;
  for (uint64_t i = 0; i < k; ++i) {
    uint64_t index = load<uint32_t>(indices + 4 * i);
    if (index >= n)
      malformed(WireFormat::topk, fmt::format("index {} of {} elements", index, n), what);
    if (i > 0 && index <= load<uint32_t>(indices + 4 * (i - 1)))
      malformed(WireFormat::topk,
                fmt::format("index {} after {}: indices must ascend", index,
                            load<uint32_t>(indices + 4 * (i - 1))),
                what);
  }
  return n;
}

uint64_t onebit_elements(DType dtype, std::span<const std::byte> body) {
  const uint64_t head = 4 + element_bytes(dtype);
  if (body.size() < head)
    malformed(WireFormat::onebit,
              fmt::format("{} bytes, under the {} of its count and scale", body.size(), head));
  const uint64_t n = load<uint32_t>(body.data());
  if (body.size() != head + (n + 7) / 8)
    malformed(WireFormat::onebit, fmt::format("{} bytes where {} elements take {}", body.size(), n,
                                              head + (n + 7) / 8));
  return n;
}

}  // namespace

void check(const Compression& compression) {
  if (!carries_pulls(compression.pull))
    fail(ErrorCode::invalid_argument,
         "compression: pull format {} is none a value travels in (expected none, bf16, fp16 or "
         "topk)",
         to_string(compression.pull));
  if (!carries_values(compression.pull_full))
    fail(ErrorCode::invalid_argument,
         "compression: pull_full format {} does not carry values (expected none, bf16 or fp16)",
         to_string(compression.pull_full));
  if (!TopK::is_fraction(compression.topk.fraction))
    fail(ErrorCode::invalid_argument, "compression: topk_fraction {} is not a fraction in (0, 1]",
         compression.topk.fraction);
  if (!TopK::is_fraction(compression.pull_fraction))
    fail(ErrorCode::invalid_argument, "compression: pull_fraction {} is not a fraction in (0, 1]",
         compression.pull_fraction);
  if (compression.ring == 0)
    fail(ErrorCode::invalid_argument,
         "compression: ring 0 keeps no delta (at least 1: the newest one)");
}

void encode_topk_with_feedback(DType dtype, std::span<const std::byte> gradient,
                               std::span<std::byte> residual, const TopK& topk,
                               std::vector<std::byte>& body) {
  PSCHED_REQUIRE(
      gradient.size() == residual.size() && residual.size() / element_bytes(dtype) <= UINT32_MAX,
      gradient.size(), residual.size());
  visit_dtype(dtype, [&]<typename T>(T) {
    encode_topk<T, T>(typed<T>(residual), typed<T>(gradient), topk, body);
  });
}

void encode_delta(DType dtype, std::span<const std::byte> current, std::span<std::byte> published,
                  uint64_t k, std::vector<std::byte>& body, std::vector<uint32_t>& sent) {
  PSCHED_REQUIRE(
      current.size() == published.size() && current.size() / element_bytes(dtype) <= UINT32_MAX,
      current.size(), published.size());
  visit_dtype(dtype, [&]<typename T>(T) {
    encode_delta<T>(typed<T>(current), typed<T>(published), k, body, sent);
  });
}

void encode_delta_at(DType dtype, std::span<const std::byte> values,
                     std::span<const uint32_t> indices, std::vector<std::byte>& body) {
  visit_dtype(dtype, [&]<typename T>(T) { encode_delta_at<T>(typed<T>(values), indices, body); });
}

void apply_delta(DType dtype, std::span<const std::byte> body, std::span<std::byte> out) {
  const uint64_t elements = out.size() / element_bytes(dtype);
  if (topk_elements(dtype, body, "delta") != elements)
    fail(ErrorCode::shape_mismatch, "a delta of {} elements for a range of {}",
         load<uint32_t>(body.data()), elements);
  visit_dtype(dtype, [&]<typename T>(T) { scatter_kept<T>(body, typed<T>(out)); });
}

uint64_t TopK::of(uint64_t elements) const {
  uint64_t k = count != 0
                   ? count
                   : static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(elements)));
  return std::clamp<uint64_t>(k, elements == 0 ? 0 : 1, elements);
}

void encode(WireFormat format, DType dtype, std::span<const std::byte> values, const TopK& topk,
            std::vector<std::byte>& body) {
  const uint64_t n = values.size() / element_bytes(dtype);
  PSCHED_REQUIRE(format == WireFormat::none || format == WireFormat::bf16 ||
                     format == WireFormat::fp16 || n <= UINT32_MAX,
                 n);
  visit_dtype(dtype, [&]<typename T>(T) {
    std::span<const T> v = typed<T>(values);
    switch (format) {
      case WireFormat::none:
        body.assign(values.begin(), values.end());
        return;
      case WireFormat::bf16:
      case WireFormat::fp16:
        body.resize(2 * n);
        return narrow_values(format, dtype, values, body);
      case WireFormat::topk:
        return encode_topk<T, const T>(v, {}, topk, body);
      case WireFormat::onebit:
        return encode_onebit(v, body);
    }
  });
}

void narrow_values(WireFormat format, DType dtype, std::span<const std::byte> values,
                   std::span<std::byte> out) {
  PSCHED_REQUIRE(carries_values(format), static_cast<int>(format));
  PSCHED_REQUIRE(out.size() == encoded_bytes(format, dtype, values.size() / element_bytes(dtype)),
                 out.size(), values.size());
  visit_dtype(dtype, [&]<typename T>(T) {
    std::span<const T> v = typed<T>(values);
    if (format == WireFormat::none)
      std::memcpy(out.data(), values.data(), out.size());
    else if (format == WireFormat::bf16)
      encode_16<T, half::to_bf16>(v, out.data());
    else
      encode_16<T, half::to_fp16>(v, out.data());
  });
}

uint64_t encoded_bytes(WireFormat format, DType dtype, uint64_t elements) {
  switch (format) {
    case WireFormat::none:
      return elements * element_bytes(dtype);
    case WireFormat::bf16:
    case WireFormat::fp16:
      return 2 * elements;
    case WireFormat::topk:
      return 8 + elements * (4 + element_bytes(dtype));
    case WireFormat::onebit:
      return 4 + element_bytes(dtype) + (elements + 7) / 8;
  }
  return 0;
}

uint64_t decoded_elements(WireFormat format, DType dtype, std::span<const std::byte> body) {
  switch (format) {
    case WireFormat::none:
      if (body.size() % element_bytes(dtype) != 0)
        fail(ErrorCode::invalid_argument, "a push of {} bytes is not whole {} elements",
             body.size(), to_string(dtype));
      return body.size() / element_bytes(dtype);
    case WireFormat::bf16:
    case WireFormat::fp16:
      if (body.size() % 2 != 0)
        malformed(format, fmt::format("{} bytes, not whole 16-bit values", body.size()));
      return body.size() / 2;
    case WireFormat::topk:
      return topk_elements(dtype, body);
    case WireFormat::onebit:
      return onebit_elements(dtype, body);
  }
  malformed(format, "unknown format");
}

void decode(WireFormat format, DType dtype, std::span<const std::byte> body,
            std::span<std::byte> out) {
  visit_dtype(dtype, [&]<typename T>(T) {
    std::span<T> o = typed<T>(out);
    switch (format) {
      case WireFormat::none:
        std::memcpy(out.data(), body.data(), out.size());
        return;
      case WireFormat::bf16:
        return decode_16<T, half::from_bf16>(body.data(), o);
      case WireFormat::fp16:
        return decode_16<T, half::from_fp16>(body.data(), o);
      case WireFormat::topk:
        return decode_topk(body, o);
      case WireFormat::onebit:
        return decode_onebit(body, o);
    }
  });
}

bool decodes_finite(WireFormat format, DType dtype, std::span<const std::byte> body) {
  auto halves_finite = [&](uint16_t exponent) {
    for (size_t i = 0; i + 1 < body.size(); i += 2)
      if ((load<uint16_t>(body.data() + i) & exponent) == exponent) return false;
    return true;
  };
  switch (format) {
    case WireFormat::none:
      return all_finite(dtype, body);
    case WireFormat::bf16:
      return halves_finite(0x7F80);
    case WireFormat::fp16:
      return halves_finite(0x7C00);
    case WireFormat::topk: {
      const uint64_t k = load<uint32_t>(body.data() + 4);
      return all_finite(dtype, body.subspan(8 + 4 * k));
    }
    case WireFormat::onebit:
      return all_finite(dtype, body.subspan(4, element_bytes(dtype)));
  }
  return false;
}

bool all_finite(DType dtype, std::span<const std::byte> values) {
  return visit_dtype(dtype, [&]<typename T>(T) {
    std::span<const T> v = typed<T>(values);
    return std::all_of(v.begin(), v.end(), [](T x) { return std::isfinite(x); });
  });
}

}  // namespace psched
