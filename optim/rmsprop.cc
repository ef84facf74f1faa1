// SPDX-License-Identifier: Apache-2.0
// torch.optim.RMSprop (plain, centered, with momentum).
#include "optim/kernels.h"

#include "optim/step_args.h"

namespace psched::optim::detail {
namespace {

// Slots: 0 square_avg, then momentum_buffer (kMomentum), then grad_avg (kCentered).
//   g = grad + wd*p;  square_avg = alpha*square_avg + (1-alpha)*g*g
//   avg = sqrt(square_avg - grad_avg^2) + eps, grad_avg = alpha*grad_avg + (1-alpha)*g
//         (centered), else sqrt(square_avg) + eps
//   with momentum: buf = momentum*buf + g/avg, p -= lr*buf; else p -= lr*g/avg
// kFrozen: square_avg and grad_avg are read, not updated.
template <typename T, bool kL2, bool kMomentum, bool kCentered, bool kFrozen>
struct RmspropElement {
  static constexpr size_t kSlots = 1 + kMomentum + kCentered;
  RmspropArgs<T> a;

  template <typename L>
  void operator()(L& p, L grad, std::array<L, kSlots>& state) const {
    const L g = l2_grad<kL2>(grad, a.weight_decay, p);
    const L alpha = L::splat(a.alpha), one_minus_alpha = L::splat(a.one_minus_alpha);
    L& square_avg = state[0];
    if constexpr (!kFrozen) square_avg = alpha * square_avg + one_minus_alpha * g * g;
    L avg;
    if constexpr (kCentered) {
      L& grad_avg = state[kSlots - 1];
      if constexpr (!kFrozen) grad_avg = alpha * grad_avg + one_minus_alpha * g;
      avg = sqrt(square_avg - grad_avg * grad_avg) + L::splat(a.eps);
    } else {
      avg = sqrt(square_avg) + L::splat(a.eps);
    }
    if constexpr (kMomentum) {
      L& buf = state[1];
      buf = L::splat(a.momentum) * buf + g / avg;
      p = p - L::splat(a.lr) * buf;
    } else {
      p = p - L::splat(a.lr) * g / avg;
    }
  }
};

}  // namespace

template <typename T>
void apply_rmsprop(const OptimizerSpec& spec, const Range<T>& range, uint64_t frozen_after) {
  const RmspropArgs<T> a = rmsprop_args<T>(spec, frozen_after);
  with_flag(a.weight_decay != T(0), [&](auto l2) {
    with_flag(a.momentum_slot >= 0, [&](auto momentum) {
      with_flag(a.grad_avg_slot >= 0, [&](auto centered) {
        with_flag(a.freeze_variance, [&](auto frozen) {
          using Element = RmspropElement<T, l2, momentum, centered, frozen>;
          for_each_element<Element::kSlots>(range, Element{a});
        });
      });
    });
  });
}

template void apply_rmsprop<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_rmsprop<double>(const OptimizerSpec&, const Range<double>&, uint64_t);

}  // namespace psched::optim::detail
