// SPDX-License-Identifier: Apache-2.0
// Test-only: each optimizer's reference formula (see optimizer.h) as a plain scalar update of
// one element, written from PyTorch 1.13's torch.optim documentation and TensorFlow's
// ApplyAdam, independently of the Eigen kernels: nothing is shared with them but
// OptimizerSpec and the slot order documented in optimizer.h.
//
// R is the arithmetic type: double for the reference proper, float to reproduce a float
// kernel's rounding. Scalars derived from hyper-parameters (1 - beta, bias corrections, the
// decayed lr) are computed in double and then rounded to R, as torch computes them in Python
// floats before handing them to a float tensor op.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "optim/optimizer.h"

namespace psched::optim::testing {

// One element of a variable: the parameter and its state slots, in optimizer.h's slot order.
template <typename R>
struct Element {
  R p = 0;
  std::array<R, 3> s{};
};

// Rounds a double-precision hyper-parameter (or derived scalar) to R.
template <typename R>
R to(double x) {
  return static_cast<R>(x);
}

// torch's L2 term: grad + wd*p, skipped when wd == 0.
template <typename R>
R l2_grad(const OptimizerSpec& o, R grad, R p) {
  return o.weight_decay != 0 ? grad + to<R>(o.weight_decay) * p : grad;
}

template <typename R>
void reference_sgd(const OptimizerSpec& o, Element<R>& e, R grad) {
  const R g = l2_grad(o, grad, e.p);
  e.p = e.p - to<R>(o.lr) * g;
}

// torch.optim.SGD: the buffer is created as a copy of g at the first step; momentum == 0
// means no buffer at all.
template <typename R>
void reference_momentum(const OptimizerSpec& o, Element<R>& e, R grad, uint64_t t) {
  if (o.momentum == 0) return reference_sgd(o, e, grad);
  R g = l2_grad(o, grad, e.p);
  R& buf = e.s[0];
  buf = t == 1 ? g : to<R>(o.momentum) * buf + to<R>(1 - o.dampening) * g;
  g = o.nesterov ? g + to<R>(o.momentum) * buf : buf;
  e.p = e.p - to<R>(o.lr) * g;
}

// torch.optim.Adam, or torch.optim.AdamW when `decoupled`. A frozen v (frozen_after != 0) is
// left as it is and bias-corrected as of update `frozen_after`.
template <typename R>
void reference_adam(const OptimizerSpec& o, Element<R>& e, R grad, uint64_t t, bool decoupled,
                    uint64_t frozen_after) {
  R g = grad;
  if (decoupled) {
    e.p = e.p * to<R>(1 - o.lr * o.weight_decay);
  } else {
    g = l2_grad(o, grad, e.p);
  }
  R& m = e.s[0];
  R& v = e.s[1];
  m = to<R>(o.beta1) * m + to<R>(1 - o.beta1) * g;
  if (frozen_after == 0) v = to<R>(o.beta2) * v + to<R>(1 - o.beta2) * g * g;
  const uint64_t v_updates = frozen_after == 0 ? t : frozen_after;
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(v_updates));
  R v_used = v;
  if (o.amsgrad) {
    e.s[2] = std::max(e.s[2], v);
    v_used = e.s[2];
  }
  const R denom = std::sqrt(v_used) / to<R>(std::sqrt(bias_correction2)) + to<R>(o.eps);
  e.p = e.p - to<R>(o.lr / bias_correction1) * m / denom;
}

// TensorFlow ApplyAdam; weight_decay is not part of it.
template <typename R>
void reference_adam_tf(const OptimizerSpec& o, Element<R>& e, R g, uint64_t t,
                       uint64_t frozen_after) {
  const uint64_t v_updates = frozen_after == 0 ? t : frozen_after;
  const double beta1_t = std::pow(o.beta1, static_cast<double>(t));
  const double beta2_t = std::pow(o.beta2, static_cast<double>(v_updates));
  const R lr_t = to<R>(o.lr * std::sqrt(1 - beta2_t) / (1 - beta1_t));
  R& m = e.s[0];
  R& v = e.s[1];
  m = to<R>(o.beta1) * m + to<R>(1 - o.beta1) * g;
  if (frozen_after == 0) v = to<R>(o.beta2) * v + to<R>(1 - o.beta2) * g * g;
  e.p = e.p - lr_t * m / (std::sqrt(v) + to<R>(o.eps));
}

// torch.optim.Adagrad.
template <typename R>
void reference_adagrad(const OptimizerSpec& o, Element<R>& e, R grad, uint64_t t, bool frozen) {
  const R g = l2_grad(o, grad, e.p);
  const R clr = to<R>(o.lr / (1 + static_cast<double>(t - 1) * o.lr_decay));
  R& sum = e.s[0];
  if (!frozen) sum = sum + g * g;
  e.p = e.p - clr * g / (std::sqrt(sum) + to<R>(o.eps));
}

// torch.optim.RMSprop; slots square_avg, [momentum_buffer], [grad_avg].
template <typename R>
void reference_rmsprop(const OptimizerSpec& o, Element<R>& e, R grad, bool frozen) {
  const R g = l2_grad(o, grad, e.p);
  const R alpha = to<R>(o.alpha);
  const R one_minus_alpha = to<R>(1 - o.alpha);
  int next_slot = 1;
  R* buf = o.momentum > 0 ? &e.s[next_slot++] : nullptr;
  R* grad_avg = o.centered ? &e.s[next_slot++] : nullptr;
  R& square_avg = e.s[0];
  if (!frozen) square_avg = alpha * square_avg + one_minus_alpha * g * g;
  R avg = std::sqrt(square_avg) + to<R>(o.eps);
  if (grad_avg) {
    if (!frozen) *grad_avg = alpha * *grad_avg + one_minus_alpha * g;
    avg = std::sqrt(square_avg - *grad_avg * *grad_avg) + to<R>(o.eps);
  }
  if (buf) {
    *buf = to<R>(o.momentum) * *buf + g / avg;
    e.p = e.p - to<R>(o.lr) * *buf;
  } else {
    e.p = e.p - to<R>(o.lr) * g / avg;
  }
}

// One update of one element by the formula of `o.kind`; `t` is the 1-based step; the
// adaptive optimizers' second moment frozen after update `frozen_after` (0: not frozen).
template <typename R>
void reference_step(const OptimizerSpec& o, Element<R>& e, R grad, uint64_t t,
                    uint64_t frozen_after = 0) {
  switch (o.kind) {
    case OptimizerKind::sgd:
      return reference_sgd(o, e, grad);
    case OptimizerKind::momentum:
      return reference_momentum(o, e, grad, t);
    case OptimizerKind::adam:
      return reference_adam(o, e, grad, t, /*decoupled=*/false, frozen_after);
    case OptimizerKind::adamw:
      return reference_adam(o, e, grad, t, /*decoupled=*/true, frozen_after);
    case OptimizerKind::adam_tf:
      return reference_adam_tf(o, e, grad, t, frozen_after);
    case OptimizerKind::adagrad:
      return reference_adagrad(o, e, grad, t, frozen_after != 0);
    case OptimizerKind::rmsprop:
      return reference_rmsprop(o, e, grad, frozen_after != 0);
  }
}

// The state every element starts with: adagrad's sum starts at initial_accumulator_value.
template <typename R>
Element<R> reference_initial_element(const OptimizerSpec& o, R p) {
  Element<R> e{p, {}};
  if (o.kind == OptimizerKind::adagrad) e.s[0] = to<R>(o.initial_accumulator_value);
  return e;
}

// How many of Element::s the formula of `o` uses.
inline int reference_slot_count(const OptimizerSpec& o) {
  switch (o.kind) {
    case OptimizerKind::sgd:
      return 0;
    case OptimizerKind::momentum:
      return 1;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return o.amsgrad ? 3 : 2;
    case OptimizerKind::adam_tf:
      return 2;
    case OptimizerKind::adagrad:
      return 1;
    case OptimizerKind::rmsprop:
      return 1 + int(o.momentum > 0) + int(o.centered);
  }
  return -1;
}

}  // namespace psched::optim::testing
