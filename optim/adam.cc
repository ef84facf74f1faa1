// The Adam family: torch.optim.Adam, torch.optim.AdamW and TensorFlow's ApplyAdam (adam_tf).
#include "optim/kernels.h"

#include <cmath>

namespace psched::optim::detail {
namespace {

// Per-step scalars of torch's Adam, computed in double (torch: Python floats), cast to T.
template <typename T>
struct AdamScalars {
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T step_size;              // lr / (1 - beta1^t)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  T eps;
  T weight_decay;  // L2 on the gradient (adam); 0 for adamw, whose decay is applied apart
  bool amsgrad;
};

template <typename T>
AdamScalars<T> adam_scalars(const OptimizerSpec& spec, uint64_t t, double weight_decay) {
  const double bias_correction1 = 1 - std::pow(spec.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(spec.beta2, static_cast<double>(t));
  return {static_cast<T>(spec.beta1),
          static_cast<T>(1 - spec.beta1),
          static_cast<T>(spec.beta2),
          static_cast<T>(1 - spec.beta2),
          static_cast<T>(spec.lr / bias_correction1),
          static_cast<T>(std::sqrt(bias_correction2)),
          static_cast<T>(spec.eps),
          static_cast<T>(weight_decay),
          spec.amsgrad};
}

// Slots: 0 m, 1 v, 2 max(v) with amsgrad.
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  vmax = max(vmax, v)
//   p -= step_size * m / (sqrt(v or vmax) / sqrt(bc2) + eps)
template <typename T>
void adam_chunk(const AdamScalars<T>& s, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  auto m = as_array(chunk.state[0]);
  auto v = as_array(chunk.state[1]);
  with_l2_grad(s.weight_decay, as_array(chunk.grad), p, [&](const auto& g) {
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
  });
  if (s.amsgrad) {
    auto v_max = as_array(chunk.state[2]);
    v_max = v_max.max(v);
    p -= s.step_size * m / (v_max.sqrt() / s.bias_correction2_sqrt + s.eps);
  } else {
    p -= s.step_size * m / (v.sqrt() / s.bias_correction2_sqrt + s.eps);
  }
}

// TensorFlow ApplyAdam, slots 0 m, 1 v: lr_t = lr * sqrt(1-b2^t) / (1-b1^t);
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  p -= lr_t * m / (sqrt(v) + eps)
template <typename T>
void adam_tf_chunk(const AdamScalars<T>& s, T lr_t, const Chunk<T>& chunk) {
  auto p = as_array(chunk.param);
  auto g = as_array(chunk.grad);
  auto m = as_array(chunk.state[0]);
  auto v = as_array(chunk.state[1]);
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  p -= lr_t * m / (v.sqrt() + s.eps);
}

}  // namespace

template <typename T>
void apply_adam(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  const auto s = adam_scalars<T>(spec, t, spec.weight_decay);
  for_each_chunk(range, [&](const Chunk<T>& chunk) { adam_chunk(s, chunk); });
}

template <typename T>
void apply_adamw(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  const auto s = adam_scalars<T>(spec, t, 0.0);
  const T decay = static_cast<T>(1 - spec.lr * spec.weight_decay);
  for_each_chunk(range, [&](const Chunk<T>& chunk) {
    as_array(chunk.param) *= decay;
    adam_chunk(s, chunk);
  });
}

template <typename T>
void apply_adam_tf(const OptimizerSpec& spec, const Range<T>& range, uint64_t t) {
  const auto s = adam_scalars<T>(spec, t, 0.0);
  const double beta1_power = std::pow(spec.beta1, static_cast<double>(t));
  const double beta2_power = std::pow(spec.beta2, static_cast<double>(t));
  const T lr_t = static_cast<T>(spec.lr * std::sqrt(1 - beta2_power) / (1 - beta1_power));
  for_each_chunk(range, [&](const Chunk<T>& chunk) { adam_tf_chunk(s, lr_t, chunk); });
}

template void apply_adam<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_adam<double>(const OptimizerSpec&, const Range<double>&, uint64_t);
template void apply_adamw<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_adamw<double>(const OptimizerSpec&, const Range<double>&, uint64_t);
template void apply_adam_tf<float>(const OptimizerSpec&, const Range<float>&, uint64_t);
template void apply_adam_tf<double>(const OptimizerSpec&, const Range<double>&, uint64_t);

}  // namespace psched::optim::detail
