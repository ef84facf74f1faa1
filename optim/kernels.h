// SPDX-License-Identifier: Apache-2.0
// Internal to optim/: one entry point per optimizer family, each defined in its own .cc
// (sgd.cc, adam.cc, adagrad.cc, rmsprop.cc) and instantiated for float and double.
//
// Each takes a spec that passed validate(), a range whose sizes apply() checked, the 1-based
// step t and, for the adaptive ones, the update their variance froze after (0: not frozen);
// computes its per-step scalars once, in double, casts them to T (step_args.h, shared with the CUDA
// kernels), and runs an element-wise kernel over the range in one fused pass (lanes.h).
#pragma once

#include <cstdint>

#include "optim/lanes.h"
#include "optim/optimizer.h"

namespace psched::optim::detail {

// torch.optim.SGD without momentum: p -= lr * (grad + wd*p).
template <typename T>
void apply_sgd(const OptimizerSpec& spec, const Range<T>& range);

// torch.optim.SGD with momentum (dampening, nesterov); slot 0 is the momentum buffer, set to
// the gradient at t == 1. momentum == 0 is plain sgd (the buffer is left alone), as in torch.
template <typename T>
void apply_momentum(const OptimizerSpec& spec, const Range<T>& range, uint64_t t);

// torch.optim.Adam: L2 weight decay on the gradient, amsgrad option.
template <typename T>
void apply_adam(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                uint64_t frozen_after);

// torch.optim.AdamW: p *= 1 - lr*wd, then Adam without weight decay.
template <typename T>
void apply_adamw(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                 uint64_t frozen_after);

// TensorFlow ApplyAdam: lr_t = lr*sqrt(1-b2^t)/(1-b1^t); eps added to sqrt(v); no decay.
template <typename T>
void apply_adam_tf(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                   uint64_t frozen_after);

// torch.optim.Adagrad: lr decayed by (1 + (t-1)*lr_decay), slot 0 the sum of squares.
template <typename T>
void apply_adagrad(const OptimizerSpec& spec, const Range<T>& range, uint64_t t,
                   uint64_t frozen_after);

// torch.optim.RMSprop: slots square_avg, [momentum_buffer], [grad_avg] (see optimizer.h).
template <typename T>
void apply_rmsprop(const OptimizerSpec& spec, const Range<T>& range, uint64_t frozen_after);

}  // namespace psched::optim::detail
