// SPDX-License-Identifier: Apache-2.0
// torch.optim.Adagrad.
#include "optim/kernels.h"

#include "optim/step_args.h"

namespace psched::optim::detail {
namespace {

// Slot 0 sum: g = grad + wd*p;  sum += g*g (kFrozen: sum read);  p -= clr * g / (sqrt(sum) + eps).
template <typename T, bool kL2, bool kFrozen>
struct AdagradElement {
  AdagradArgs<T> a;

  template <typename L>
  void operator()(L& p, L grad, std::array<L, 1>& state) const {
    const L g = l2_grad<kL2>(grad, a.weight_decay, p);
    L& sum = state[0];
    if constexpr (!kFrozen) sum = sum + g * g;
    p = p - L::splat(a.clr) * g / (sqrt(sum) + L::splat(a.eps));
  }
};

}  // namespace

template <typename T>
void apply_adagrad(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                   uint64_t frozen_after) {
  const AdagradArgs<T> a = adagrad_args<T>(spec, t, frozen_after);
  with_flag(a.weight_decay != T(0), [&](auto l2) {
    with_flag(a.freeze_variance,
              [&](auto frozen) { for_each_element<1>(range, AdagradElement<T, l2, frozen>{a}); });
  });
}

template void apply_adagrad<float>(const OptimizerSpec&, const Range<float>&, uint64_t, uint64_t);
template void apply_adagrad<double>(const OptimizerSpec&, const Range<double>&, uint64_t, uint64_t);

}  // namespace psched::optim::detail
