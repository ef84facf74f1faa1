// torch.optim.Adagrad.
#include "optim/kernels.h"

namespace psched::optim::detail {
namespace {

// Slot 0 sum: g = grad + wd*p;  sum += g*g;  p -= clr * g / (sqrt(sum) + eps).
template <typename T>
void adagrad_chunk(T clr, T weight_decay, T eps, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  auto sum = as_array(chunk.state[0]);
  with_l2_grad(weight_decay, as_array(chunk.grad), p, [&](const auto& g) {
    sum += g * g;
    p -= clr * g / (sum.sqrt() + eps);
  });
}

}  // namespace

template <typename T>
void apply_adagrad(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  const T clr = static_cast<T>(spec.lr / (1 + static_cast<double>(t - 1) * spec.lr_decay));
  const T weight_decay = static_cast<T>(spec.weight_decay);
  const T eps = static_cast<T>(spec.eps);
  for_each_chunk(range,
                 [&](const Chunk<T>& chunk) { adagrad_chunk(clr, weight_decay, eps, chunk); });
}

template void apply_adagrad<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_adagrad<double>(const OptimizerSpec&, const Range<double>&, uint64_t);

}  // namespace psched::optim::detail
