// SPDX-License-Identifier: Apache-2.0
// The Adam family: torch.optim.Adam, torch.optim.AdamW and TensorFlow's ApplyAdam (adam_tf).
// One fused pass: each element's param, grad, m, v (and max v) are read once and
// written once (lanes.h); the per-step scalars are the GPU kernels' (step_args.h).
#include "optim/kernels.h"

#include "optim/lanes.h"
#include "optim/step_args.h"

namespace psched::optim::detail {
namespace {

// Slots: 0 m, 1 v, 2 max(v) with amsgrad. With kDecay (adamw) p *= decay first; with kL2
// (adam, weight_decay != 0) g = grad + wd*p. Then
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  vmax = max(vmax, v)   (v, vmax: kFrozen reads)
//   p -= step_size * m / (sqrt(v or vmax) / sqrt(bc2) + eps)
template <typename T, bool kDecay, bool kL2, bool kAmsgrad, bool kFrozen>
struct AdamElement {
  AdamArgs<T> a;

  template <typename L, size_t kSlots>
  void operator()(L& p, L grad, std::array<L, kSlots>& state) const {
    if constexpr (kDecay) p = p * L::splat(a.decay);
    const L g = l2_grad<kL2>(grad, a.weight_decay, p);
    L& m = state[0];
    L& v = state[1];
    m = L::splat(a.beta1) * m + L::splat(a.one_minus_beta1) * g;
    if constexpr (!kFrozen) v = L::splat(a.beta2) * v + L::splat(a.one_minus_beta2) * g * g;
    L v_used = v;
    if constexpr (kAmsgrad) v_used = state[2] = max(state[2], v);
    p = p - L::splat(a.step_size) * m /
                (sqrt(v_used) / L::splat(a.bias_correction2_sqrt) + L::splat(a.eps));
  }
};

template <typename T, bool kDecay>
void run_adam(const AdamArgs<T>& a, const Range<T>& range) {
  with_flag(a.weight_decay != T(0), [&](auto l2) {
    with_flag(a.freeze_variance, [&](auto frozen) {
      if (a.amsgrad) return for_each_element<3>(range, AdamElement<T, kDecay, l2, true, frozen>{a});
      for_each_element<2>(range, AdamElement<T, kDecay, l2, false, frozen>{a});
    });
  });
}

// TensorFlow ApplyAdam, slots 0 m, 1 v: lr_t = lr * sqrt(1-b2^t) / (1-b1^t);
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g (kFrozen: v read);  p -= lr_t * m / (sqrt(v) + eps)
template <typename T, bool kFrozen>
struct AdamTfElement {
  AdamTfArgs<T> a;

  template <typename L>
  void operator()(L& p, L g, std::array<L, 2>& state) const {
    L& m = state[0];
    L& v = state[1];
    m = L::splat(a.beta1) * m + L::splat(a.one_minus_beta1) * g;
    if constexpr (!kFrozen) v = L::splat(a.beta2) * v + L::splat(a.one_minus_beta2) * g * g;
    p = p - L::splat(a.lr_t) * m / (sqrt(v) + L::splat(a.eps));
  }
};

}  // namespace

template <typename T>
void apply_adam(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                uint64_t frozen_after) {
  run_adam<T, false>(adam_args<T>(spec, t, frozen_after), range);
}

template <typename T>
void apply_adamw(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                 uint64_t frozen_after) {
  run_adam<T, true>(adam_args<T>(spec, t, frozen_after), range);  // weight_decay 0: no L2 term
}

template <typename T>
void apply_adam_tf(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                   uint64_t frozen_after) {
  const AdamTfArgs<T> a = adam_tf_args<T>(spec, t, frozen_after);
  with_flag(a.freeze_variance,
            [&](auto frozen) { for_each_element<2>(range, AdamTfElement<T, frozen>{a}); });
}

#define PSCHED_INSTANTIATE(T)                                                              \
  template void apply_adam<T>(const OptimizerSpec&, const Range<T>&, uint64_t, uint64_t);  \
  template void apply_adamw<T>(const OptimizerSpec&, const Range<T>&, uint64_t, uint64_t); \
  template void apply_adam_tf<T>(const OptimizerSpec&, const Range<T>&, uint64_t, uint64_t);
PSCHED_INSTANTIATE(float)
PSCHED_INSTANTIATE(double)
#undef PSCHED_INSTANTIATE

}  // namespace psched::optim::detail
