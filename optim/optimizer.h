// SPDX-License-Identifier: Apache-2.0
// Optimizer settings and the kernel entry point a shard calls for each received partition.
//
// Every optimizer is defined by the formula of a named reference: PyTorch's `torch.optim`
// documentation for sgd/momentum/adam/adamw/adagrad/rmsprop, TensorFlow's ApplyAdam for
// adam_tf (eps added to sqrt(v); lr scaled by sqrt(1-b2^t)/(1-b1^t)).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace psched::optim {

enum class OptimizerKind {
  sgd,       ///< p -= lr * (g + wd*p)
  momentum,  ///< torch.optim.SGD with momentum (dampening, nesterov options); momentum 0 = sgd
  adam,      ///< torch.optim.Adam (weight_decay as L2 on the gradient, amsgrad option)
  adam_tf,   ///< TensorFlow ApplyAdam, as the original plugin applies it
  adamw,     ///< torch.optim.AdamW (decoupled weight decay, amsgrad option)
  adagrad,   ///< torch.optim.Adagrad (lr_decay, initial_accumulator_value)
  rmsprop,   ///< torch.optim.RMSprop (alpha, momentum, centered)
};

std::string_view to_string(OptimizerKind kind);
// Inverse of to_string; returns false when `name` names no optimizer.
bool parse_optimizer_kind(std::string_view name, OptimizerKind& out);

// Hyper-parameters; each optimizer reads the ones its reference formula names and ignores the
// rest. Defaults are PyTorch's.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.01;
  double momentum = 0.0;      // momentum, rmsprop
  double dampening = 0.0;     // momentum
  bool nesterov = false;      // momentum
  double beta1 = 0.9;         // adam, adam_tf, adamw
  double beta2 = 0.999;       // adam, adam_tf, adamw
  double eps = 1e-8;          // adam, adam_tf, adamw, adagrad (1e-10 in torch), rmsprop
  double weight_decay = 0.0;  // all but adam_tf (adamw default in torch is 0.01; set it)
  bool amsgrad = false;       // adam, adamw
  double lr_decay = 0.0;      // adagrad
  double initial_accumulator_value = 0.0;  // adagrad
  double alpha = 0.99;                     // rmsprop smoothing constant
  bool centered = false;                   // rmsprop

  bool operator==(const OptimizerSpec&) const = default;
};

// Every hyper-parameter of OptimizerSpec, once, in the struct's order: X(field, WireField), the
// field's name here (and in the deployment file and Python) and its name in net/psched.capnp's
// OptimizerSpec. The wire conversion, the checkpoint codec, the config loader and the Python
// binding expand it, so a new hyper-parameter is added here, to the struct and to the schema.
#define PSCHED_OPTIMIZER_FIELDS(X)                      \
  X(lr, Lr)                                             \
  X(momentum, Momentum)                                 \
  X(dampening, Dampening)                               \
  X(nesterov, Nesterov)                                 \
  X(beta1, Beta1)                                       \
  X(beta2, Beta2)                                       \
  X(eps, Eps)                                           \
  X(weight_decay, WeightDecay)                          \
  X(amsgrad, Amsgrad)                                   \
  X(lr_decay, LrDecay)                                  \
  X(initial_accumulator_value, InitialAccumulatorValue) \
  X(alpha, Alpha)                                       \
  X(centered, Centered)

// Calls visit(name, member) for each hyper-parameter, in the struct's order; `member` is a
// `double OptimizerSpec::*` or a `bool OptimizerSpec::*`.
template <typename Visit>
constexpr void for_each_hyperparameter(Visit&& visit) {
#define PSCHED_VISIT_FIELD(field, Wire) visit(std::string_view(#field), &OptimizerSpec::field);
  PSCHED_OPTIMIZER_FIELDS(PSCHED_VISIT_FIELD)
#undef PSCHED_VISIT_FIELD
}

// torch.optim's (1.13) defaults for `kind`: lr 1e-3 for adam and adamw, 1e-2 for adagrad and
// rmsprop, adamw's weight_decay 1e-2, adagrad's eps 1e-10, the rest as OptimizerSpec's;
// adam_tf takes TensorFlow's AdamOptimizer's lr 1e-3. torch.optim.SGD has no default lr:
// sgd and momentum keep OptimizerSpec's 0.01, and a caller speaking for torch requires one.
OptimizerSpec torch_defaults(OptimizerKind kind);

// Number of per-element state arrays the optimizer keeps (momentum buffer, m, v, ...). Each
// has as many elements as the variable (or the shard's range of it). Slot order, as `apply`
// reads `state` (torch's state-dict order):
//   sgd       none
//   momentum  0 momentum_buffer
//   adam      0 exp_avg (m), 1 exp_avg_sq (v), 2 max_exp_avg_sq (only with amsgrad)
//   adamw     as adam
//   adam_tf   0 m, 1 v
//   adagrad   0 sum (starts at initial_accumulator_value)
//   rmsprop   0 square_avg, then momentum_buffer (only with momentum > 0), then grad_avg
//             (only with centered): 1 to 3 slots
int state_slots(const OptimizerSpec& spec);

// Initial value of state slot `slot` (all elements); 0 except adagrad's accumulator.
double initial_state_value(const OptimizerSpec& spec, int slot);

// Throws psched::Error(invalid_argument) naming the bad field when a hyper-parameter is out of
// its valid range (negative lr, beta outside [0,1), nesterov without momentum, ...).
void validate(const OptimizerSpec& spec);

// One update of `param` by `grad`, element-wise, in place:
//   param[i], state[k][i]  <-  formula(param[i], grad[i], state[k][i], t)
// `state` holds state_slots(spec) spans, each as long as `param`; `grad` as long as `param`.
// `t` is the 1-based count of updates applied to this variable, this one included (bias
// correction, adagrad's lr decay).
//
// `variance_frozen_after` (0: not frozen; else below `t`) freezes the adaptive optimizers'
// second moment as it stood after update number `variance_frozen_after`: adam, adamw and
// adam_tf read v (and amsgrad's max) without updating it and bias-correct it with that count;
// adagrad reads its sum, rmsprop its square_avg (and centered grad_avg), without updating
// them. The update is then linear in the gradient, as 1-bit Adam makes it after its warm-up: a
// shard applies sparse and 1-bit gradients so (docs/compression.md). sgd and momentum ignore it.
// Runs on the calling thread; element-wise, so a caller may apply disjoint pieces of a range on
// several threads (the shard does, for large partitions). `grad` may point straight into a received
// message: it is only read, never copied. `spec` must have passed validate(); sizes and `t` are
// checked (PSCHED_REQUIRE). Arithmetic is in the element type; hyper-parameters and the per-step
// scalars derived from them (bias corrections, adagrad's decayed lr) are computed in double and
// then cast, as torch does with Python floats. Each element's result is independent of the range's
// length, address and split, so a partition applied in pieces equals the whole applied at once, bit
// for bit.
void apply(const OptimizerSpec& spec, std::span<float> param, std::span<const float> grad,
           std::span<const std::span<float>> state, uint64_t t, uint64_t variance_frozen_after = 0);
void apply(const OptimizerSpec& spec, std::span<double> param, std::span<const double> grad,
           std::span<const std::span<double>> state, uint64_t t,
           uint64_t variance_frozen_after = 0);

}  // namespace psched::optim
