// SPDX-License-Identifier: Apache-2.0
// torch.optim.SGD, without and with momentum (optimizer kinds sgd and momentum).
#include "optim/kernels.h"

#include "optim/step_args.h"

namespace psched::optim::detail {
namespace {

// p -= lr * g, g = grad + wd*p.
template <typename T, bool kL2>
struct SgdElement {
  SgdArgs<T> a;

  template <typename L>
  void operator()(L& p, L grad, std::array<L, 0>&) const {
    p = p - L::splat(a.lr) * l2_grad<kL2>(grad, a.weight_decay, p);
  }
};

// Slot 0 buf: buf = g (first step) or momentum*buf + (1-dampening)*g; p -= lr * (nesterov ?
// g + momentum*buf : buf).
template <typename T, bool kL2, bool kNesterov>
struct MomentumElement {
  MomentumArgs<T> a;

  template <typename L>
  void operator()(L& p, L grad, std::array<L, 1>& state) const {
    const L g = l2_grad<kL2>(grad, a.weight_decay, p);
    L& buf = state[0];
    buf = a.first_step ? g : L::splat(a.momentum) * buf + L::splat(a.one_minus_dampening) * g;
    if constexpr (kNesterov) {
      p = p - L::splat(a.lr) * (g + L::splat(a.momentum) * buf);
    } else {
      p = p - L::splat(a.lr) * buf;
    }
  }
};

}  // namespace

template <typename T>
void apply_sgd(const OptimizerSpec& spec, const Range<T>& range) {
  const SgdArgs<T> a = sgd_args<T>(spec);
  with_flag(a.weight_decay != T(0),
            [&](auto l2) { for_each_element<0>(range, SgdElement<T, l2>{a}); });
}

template <typename T>
void apply_momentum(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  if (spec.momentum == 0) return apply_sgd(spec, range);  // torch: no buffer without momentum
  const MomentumArgs<T> a = momentum_args<T>(spec, t);
  with_flag(a.weight_decay != T(0), [&](auto l2) {
    with_flag(a.nesterov, [&](auto nesterov) {
      for_each_element<1>(range, MomentumElement<T, l2, nesterov>{a});
    });
  });
}

template void apply_sgd<float>(const OptimizerSpec&, const Range<float>&);
template void apply_sgd<double>(const OptimizerSpec&, const Range<double>&);
template void apply_momentum<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_momentum<double>(const OptimizerSpec&, const Range<double>&, uint64_t);

}  // namespace psched::optim::detail
