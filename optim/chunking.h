// Internal to optim/: views of one apply() call's buffers as Eigen arrays, cut into chunks
// processed one after the other.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>

#include <Eigen/Core>

namespace psched::optim::detail {

// Most state slots any optimizer keeps (adam with amsgrad, rmsprop centered with momentum).
inline constexpr int kMaxStateSlots = 3;

// Elements per chunk: small enough that a chunk's arrays stay in L2 across the kernel's few
// passes over them.
inline constexpr size_t kChunkElements = 8192;


// One contiguous piece of a range. Views into the caller's buffers; owns nothing. Only the
// first state_slots(spec) entries of `state` are set.
template <typename T>
struct Chunk {
  std::span<T> param;
  std::span<const T> grad;
  std::array<std::span<T>, kMaxStateSlots> state;
};

// The buffers of one apply() call, sizes already checked. Views; owns nothing.
template <typename T>
struct Range {
  std::span<T> param;
  std::span<const T> grad;
  std::span<const std::span<T>> state;

  // Elements [begin, begin + count) of every buffer.
  Chunk<T> slice(size_t begin, size_t count) const {
    Chunk<T> chunk{param.subspan(begin, count), grad.subspan(begin, count), {}};
    for (size_t k = 0; k < state.size(); ++k) chunk.state[k] = state[k].subspan(begin, count);
    return chunk;
  }
};

template <typename T>
using Array = Eigen::Array<T, Eigen::Dynamic, 1>;

// A writable Eigen view of `s` (no copy).
template <typename T>
Eigen::Map<Array<T>> as_array(std::span<T> s) {
  return {s.data(), static_cast<Eigen::Index>(s.size())};
}

// A read-only Eigen view of `s` (no copy; `grad` stays where the network put it).
template <typename T>
Eigen::Map<const Array<T>> as_array(std::span<const T> s) {
  return {s.data(), static_cast<Eigen::Index>(s.size())};
}

// Calls kernel(Chunk<T>) once per chunk of `range`, in order.
// `kernel` must touch only its chunk's elements and must not throw.
template <typename T, typename Kernel>
void for_each_chunk(const Range<T>& range, const Kernel& kernel) {
  const size_t size = range.param.size();
  const auto chunks = static_cast<std::ptrdiff_t>((size + kChunkElements - 1) / kChunkElements);
  for (std::ptrdiff_t i = 0; i < chunks; ++i) {
    const size_t begin = static_cast<size_t>(i) * kChunkElements;
    kernel(range.slice(begin, std::min(kChunkElements, size - begin)));
  }
}

// Calls body(g) with torch's L2-decayed gradient g = grad + wd*p as a lazy Eigen expression,
// or with `grad` itself when wd == 0 (torch skips the term then; 0*inf would be nan). `g` reads
// `p`, so `body` must write `p` only in its last statement.
template <typename T, typename Grad, typename Param, typename Body>
void with_l2_grad(T wd, const Grad& grad, const Param& p, const Body& body) {
  if (wd == T(0)) {
    body(grad);
  } else {
    body(grad + wd * p);
  }
}

}  // namespace psched::optim::detail
