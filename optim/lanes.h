// SPDX-License-Identifier: Apache-2.0
// Internal to optim/: element-wise kernels written once, as a template on the lanes they
// compute, and run in one fused pass over a range: SIMD packets for the body, single elements
// for the tail. Each element of param, grad and state is loaded once and stored once, the
// intermediate values stay in registers (the memory traffic of an apply is then the least it
// can be: every buffer read once, param and state written once).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>

#include <Eigen/Core>

namespace psched::optim::detail {

// The buffers of one apply() call, sizes already checked. Views; owns nothing.
template <typename T>
struct Range {
  std::span<T> param;
  std::span<const T> grad;  // may point straight into a received message: only read
  std::span<const std::span<T>> state;
};

// The type Lanes<T, kWide> computes on: Eigen's widest SIMD packet of T on this target (4
// floats with SSE2, 8 with AVX), or T itself.
template <typename T, bool kWide>
struct LanesOf {
  using type = T;
};
template <typename T>
struct LanesOf<T, true> {
  using type = typename Eigen::internal::packet_traits<T>::type;
};

// One or several elements of type T, computed alike: a SIMD packet (kWide) or one element
// (Eigen's generic packet functions then work on the scalar). Every operation is the IEEE
// operation per element (EIGEN_FAST_MATH=0: sqrt is exact; no FMA contraction), so an
// element's result does not depend on whether it was computed in a packet or alone: a range's
// result is independent of its address and split.
template <typename T, bool kWide>
struct Lanes {
  using P = typename LanesOf<T, kWide>::type;
  static constexpr size_t kCount = Eigen::internal::unpacket_traits<P>::size;

  P v;

  static Lanes load(const T* from) { return {Eigen::internal::ploadu<P>(from)}; }
  void store(T* to) const { Eigen::internal::pstoreu<T>(to, v); }
  // Every lane set to `x`.
  static Lanes splat(T x) { return {Eigen::internal::pset1<P>(x)}; }

  friend Lanes operator+(Lanes a, Lanes b) { return {Eigen::internal::padd(a.v, b.v)}; }
  friend Lanes operator-(Lanes a, Lanes b) { return {Eigen::internal::psub(a.v, b.v)}; }
  friend Lanes operator*(Lanes a, Lanes b) { return {Eigen::internal::pmul(a.v, b.v)}; }
  friend Lanes operator/(Lanes a, Lanes b) { return {Eigen::internal::pdiv(a.v, b.v)}; }
  friend Lanes sqrt(Lanes a) { return {Eigen::internal::psqrt(a.v)}; }
  // std::max(a, b) per lane (the scalar reference's max).
  friend Lanes max(Lanes a, Lanes b) { return {Eigen::internal::pmax(a.v, b.v)}; }
};

// torch's L2 term g = grad + wd*p, where kL2 (weight_decay != 0: torch skips the term at 0,
// where 0*inf would be nan).
template <bool kL2, typename L, typename T>
L l2_grad(L grad, T weight_decay, L p) {
  if constexpr (kL2) return grad + L::splat(weight_decay) * p;
  return grad;
}

// Calls body(std::bool_constant<flag>{}): a runtime flag as a compile-time one, so that a
// kernel's options cost no branch per element.
template <typename Body>
void with_flag(bool flag, const Body& body) {
  if (flag) return body(std::true_type{});
  body(std::false_type{});
}

// Runs `kernel` over every element of `range` in one pass. `kernel` is called as
// kernel(L& param, L grad, std::array<L, kSlots>& state) with L = Lanes<T, true> for the
// body and L = Lanes<T, false> for the tail; it updates param and state in place, and must
// compute the same per-element formula for both (a template on L does). kSlots is
// state_slots() of the optimizer.
template <int kSlots, typename T, typename Kernel>
void for_each_element(const Range<T>& range, const Kernel& kernel) {
  const size_t n = range.param.size();
  T* param = range.param.data();
  const T* grad = range.grad.data();
  std::array<T*, kSlots> state;
  for (int k = 0; k < kSlots; ++k) state[k] = range.state[k].data();
  auto step = [&]<typename L>(size_t i, L) {
    L p = L::load(param + i);
    std::array<L, kSlots> s;
    for (int k = 0; k < kSlots; ++k) s[k] = L::load(state[k] + i);
    kernel(p, L::load(grad + i), s);
    p.store(param + i);
    for (int k = 0; k < kSlots; ++k) s[k].store(state[k] + i);
  };
  using Wide = Lanes<T, true>;
  size_t i = 0;
  for (; i + Wide::kCount <= n; i += Wide::kCount) step(i, Wide{});
  for (; i < n; ++i) step(i, Lanes<T, false>{});
}

}  // namespace psched::optim::detail
