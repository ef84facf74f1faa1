// torch.optim.SGD, without and with momentum (optimizer kinds sgd and momentum).
#include "optim/kernels.h"

namespace psched::optim::detail {
namespace {

// Per-step scalars, cast to the element type once per apply().
template <typename T>
struct MomentumScalars {
  T lr;
  T weight_decay;
  T momentum;
  T one_minus_dampening;
  bool nesterov;
  bool first_step;  // t == 1: torch sets the buffer to the gradient, without dampening
};

// p -= lr * g, g = grad + wd*p.
template <typename T>
void sgd_chunk(T lr, T weight_decay, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  with_l2_grad(weight_decay, as_array(chunk.grad), p, [&](const auto& g) { p -= lr * g; });
}

// buf = g (first step) or momentum*buf + (1-dampening)*g; p -= lr * (nesterov ? g +
// momentum*buf : buf).
template <typename T>
void momentum_chunk(const MomentumScalars<T>& s, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  auto buf = as_array(chunk.state[0]);
  with_l2_grad(s.weight_decay, as_array(chunk.grad), p, [&](const auto& g) {
    if (s.first_step) {
      buf = g;
    } else {
      buf = s.momentum * buf + s.one_minus_dampening * g;
    }
    if (s.nesterov) {
      p -= s.lr * (g + s.momentum * buf);
    } else {
      p -= s.lr * buf;
    }
  });
}

}  // namespace

template <typename T>
void apply_sgd(const OptimizerSpec& spec, const Range<T>& range) {
  const T lr = static_cast<T>(spec.lr);
  const T weight_decay = static_cast<T>(spec.weight_decay);
  for_each_chunk(range, [&](const Chunk<T>& chunk) { sgd_chunk(lr, weight_decay, chunk); });
}

template <typename T>
void apply_momentum(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  if (spec.momentum == 0) return apply_sgd(spec, range);  // torch: no buffer without momentum
  const MomentumScalars<T> s{static_cast<T>(spec.lr),
                             static_cast<T>(spec.weight_decay),
                             static_cast<T>(spec.momentum),
                             static_cast<T>(1 - spec.dampening),
                             spec.nesterov,
                             t == 1};
  for_each_chunk(range, [&](const Chunk<T>& chunk) { momentum_chunk(s, chunk); });
}

template void apply_sgd<float>(const OptimizerSpec&, const Range<float>&);
template void apply_sgd<double>(const OptimizerSpec&, const Range<double>&);
template void apply_momentum<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_momentum<double>(const OptimizerSpec&, const Range<double>&, uint64_t);

}  // namespace psched::optim::detail
