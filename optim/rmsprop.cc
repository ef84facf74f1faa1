// torch.optim.RMSprop (plain, centered, with momentum).
#include "optim/kernels.h"

namespace psched::optim::detail {
namespace {

// Per-step scalars, cast to T, and where the optional slots sit (see optimizer.h).
template <typename T>
struct RmspropScalars {
  T lr;
  T alpha;
  T one_minus_alpha;
  T eps;
  T weight_decay;
  T momentum;
  int momentum_slot;  // -1 without momentum
  int grad_avg_slot;  // -1 unless centered
};

template <typename T>
RmspropScalars<T> rmsprop_scalars(const OptimizerSpec& spec) {
  const bool with_momentum = spec.momentum > 0;
  const int momentum_slot = with_momentum ? 1 : -1;
  const int grad_avg_slot = spec.centered ? (with_momentum ? 2 : 1) : -1;
  return {static_cast<T>(spec.lr),
          static_cast<T>(spec.alpha),
          static_cast<T>(1 - spec.alpha),
          static_cast<T>(spec.eps),
          static_cast<T>(spec.weight_decay),
          static_cast<T>(spec.momentum),
          momentum_slot,
          grad_avg_slot};
}

// Updates the averages and calls body(avg) with the lazy denominator
//   avg = sqrt(square_avg - grad_avg^2) + eps  (centered)  or  sqrt(square_avg) + eps.
template <typename T, typename Grad, typename Body>
void with_rms_denominator(const RmspropScalars<T>& s, const Chunk<T>& chunk, const Grad& g,
                          const Body& body) {
  auto square_avg = as_array(chunk.state[0]);
  square_avg = s.alpha * square_avg + s.one_minus_alpha * g * g;
  if (s.grad_avg_slot < 0) return body(square_avg.sqrt() + s.eps);
  auto grad_avg = as_array(chunk.state[s.grad_avg_slot]);
  grad_avg = s.alpha * grad_avg + s.one_minus_alpha * g;
  body((square_avg - grad_avg * grad_avg).sqrt() + s.eps);
}

// g = grad + wd*p; with momentum: buf = momentum*buf + g/avg, p -= lr*buf; else
// p -= lr*g/avg.
template <typename T>
void rmsprop_chunk(const RmspropScalars<T>& s, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  with_l2_grad(s.weight_decay, as_array(chunk.grad), p, [&](const auto& g) {
    with_rms_denominator(s, chunk, g, [&](const auto& avg) {
      if (s.momentum_slot < 0) {
        p -= s.lr * g / avg;
        return;
      }
      auto buf = as_array(chunk.state[s.momentum_slot]);
      buf = s.momentum * buf + g / avg;
      p -= s.lr * buf;
    });
  });
}

}  // namespace

template <typename T>
void apply_rmsprop(const OptimizerSpec& spec, const Range<T>& range) {
  const auto s = rmsprop_scalars<T>(spec);
  for_each_chunk(range, [&](const Chunk<T>& chunk) { rmsprop_chunk(s, chunk); });
}

template void apply_rmsprop<float>(const OptimizerSpec&, const Range<float>&);
template void apply_rmsprop<double>(const OptimizerSpec&, const Range<double>&);

}  // namespace psched::optim::detail
