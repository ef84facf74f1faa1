// SPDX-License-Identifier: Apache-2.0
// Internal to optim/: the per-step scalars of each optimizer's update, computed once per
// apply in double (torch: Python floats) and cast to the element type T. One definition for
// the CPU kernels (optim/sgd.cc, adam.cc, adagrad.cc, rmsprop.cc) and the CUDA kernels
// (optim/gpu/fused_kernels.cu), so both compute each element from the same values. nvcc reads
// this header as C++17: plain structs, nothing newer.
#pragma once

#include <cstdint>

namespace psched::optim {

struct OptimizerSpec;  // optimizer.h

// sgd: p -= lr * g, g = grad + wd*p.
template <typename T>
struct SgdArgs {
  T lr;
  T weight_decay;
};

// momentum (momentum > 0): buf = g at the first step, else momentum*buf + (1-dampening)*g.
template <typename T>
struct MomentumArgs {
  T lr;
  T weight_decay;
  T momentum;
  T one_minus_dampening;
  bool nesterov;
  bool first_step;
};

// adam and adamw: p *= decay (adamw's 1 - lr*wd; 1 for adam, an exact no-op), then torch's
// Adam with L2 `weight_decay` (0 for adamw).
template <typename T>
struct AdamArgs {
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T step_size;              // lr / (1 - beta1^t)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  T eps;
  T weight_decay;
  T decay;
  bool amsgrad;
  bool freeze_variance;  // v (and max v) read, not updated; bias_correction2_sqrt at the freeze
};

// adam_tf: p -= lr_t * m / (sqrt(v) + eps).
template <typename T>
struct AdamTfArgs {
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T lr_t;  // lr * sqrt(1 - beta2^tv) / (1 - beta1^t), tv = t or the update v froze after
  T eps;
  bool freeze_variance;  // v read, not updated
};

// adagrad: sum += g*g; p -= clr * g / (sqrt(sum) + eps).
template <typename T>
struct AdagradArgs {
  T clr;  // lr / (1 + (t-1)*lr_decay)
  T weight_decay;
  T eps;
  bool freeze_variance;  // sum read, not updated
};

// rmsprop: slots square_avg, [momentum_buffer], [grad_avg].
template <typename T>
struct RmspropArgs {
  T lr;
  T alpha;
  T one_minus_alpha;
  T eps;
  T weight_decay;
  T momentum;
  int momentum_slot;     // -1 without momentum
  int grad_avg_slot;     // -1 unless centered
  bool freeze_variance;  // square_avg and grad_avg read, not updated
};

// The scalars of step t (1-based) for `spec`, which passed validate() (step_args.cc; float
// and double), with the variance frozen after update `frozen_after` unless it is 0
// (optimizer.h's apply). adam_args serves adam and adamw, by spec.kind.
template <typename T>
SgdArgs<T> sgd_args(const OptimizerSpec& spec);
template <typename T>
MomentumArgs<T> momentum_args(const OptimizerSpec& spec, uint64_t t);
template <typename T>
AdamArgs<T> adam_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after);
template <typename T>
AdamTfArgs<T> adam_tf_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after);
template <typename T>
AdagradArgs<T> adagrad_args(const OptimizerSpec& spec, uint64_t t, uint64_t frozen_after);
template <typename T>
RmspropArgs<T> rmsprop_args(const OptimizerSpec& spec, uint64_t frozen_after);

}  // namespace psched::optim
