// Internal to optim/gpu: the arguments of the fused CUDA kernels, plain structs shared by the
// host code that fills them (fused_apply.cc, built by the C++ compiler) and the kernels
// (fused_kernels.cu, built by nvcc). Scalars are the per-step values of the CPU kernels
// (optim/*.cc), computed in double and cast to T by fused_apply.cc.
#pragma once

#include <cstdint>

namespace psched::optim::gpu {

// Device pointers to one contiguous piece of a variable. Views; owns nothing.
template <typename T>
struct DeviceRange {
  T* param;
  const T* grad;
  T* state[3];    // the first state_slots(spec) are set, in optimizer.h's slot order
  uint64_t size;  // elements
};

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
};

// adam_tf: p -= lr_t * m / (sqrt(v) + eps).
template <typename T>
struct AdamTfArgs {
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T lr_t;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  T eps;
};

// adagrad: sum += g*g; p -= clr * g / (sqrt(sum) + eps).
template <typename T>
struct AdagradArgs {
  T clr;  // lr / (1 + (t-1)*lr_decay)
  T weight_decay;
  T eps;
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
  int momentum_slot;  // -1 without momentum
  int grad_avg_slot;  // -1 unless centered
};

}  // namespace psched::optim::gpu
