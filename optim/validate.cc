// SPDX-License-Identifier: Apache-2.0
// validate(): the hyper-parameter ranges of each optimizer, as torch.optim checks them (plus
// finiteness and the [0, 1] / [0, 1) bounds torch leaves implicit). Only the fields an
// optimizer reads are checked; the rest are ignored, as apply() ignores them.
#include <cmath>

#include "common/error.h"
#include "optim/optimizer.h"

namespace psched::optim {
namespace {

// Rejects with "optimizer '<kind>': <field> = <value> <what>".
class SpecCheck {
 public:
  explicit SpecCheck(const OptimizerSpec& spec) : kind_(to_string(spec.kind)) {}

  void non_negative(std::string_view field, double value) const {
    if (!(std::isfinite(value) && value >= 0)) reject(field, value, "must be finite and >= 0");
  }
  // [0, 1) by default, [0, 1] with `one_allowed`.
  void fraction(std::string_view field, double value, bool one_allowed = false) const {
    const bool ok = value >= 0 && (one_allowed ? value <= 1 : value < 1);
    if (!ok) reject(field, value, one_allowed ? "is outside [0, 1]" : "is outside [0, 1)");
  }
  [[noreturn]] void reject(std::string_view field, double value, std::string_view what) const {
    fail(ErrorCode::invalid_argument, "optimizer '{}': {} = {} {}", kind_, field, value, what);
  }
  std::string_view kind() const { return kind_; }

 private:
  std::string_view kind_;
};

void validate_momentum(const SpecCheck& check, const OptimizerSpec& spec) {
  check.non_negative("momentum", spec.momentum);
  check.fraction("dampening", spec.dampening, /*one_allowed=*/true);
  if (spec.nesterov && (spec.momentum <= 0 || spec.dampening != 0)) {
    fail(ErrorCode::invalid_argument,
         "optimizer '{}': nesterov = true requires momentum > 0 and dampening = 0 (momentum = "
         "{}, dampening = {})",
         check.kind(), spec.momentum, spec.dampening);
  }
}

void validate_adam(const SpecCheck& check, const OptimizerSpec& spec) {
  check.fraction("beta1", spec.beta1);
  check.fraction("beta2", spec.beta2);
  check.non_negative("eps", spec.eps);
}

void validate_adagrad(const SpecCheck& check, const OptimizerSpec& spec) {
  check.non_negative("lr_decay", spec.lr_decay);
  check.non_negative("initial_accumulator_value", spec.initial_accumulator_value);
  check.non_negative("eps", spec.eps);
}

void validate_rmsprop(const SpecCheck& check, const OptimizerSpec& spec) {
  check.fraction("alpha", spec.alpha);
  check.non_negative("eps", spec.eps);
  check.non_negative("momentum", spec.momentum);
}

}  // namespace

void validate(const OptimizerSpec& spec) {
  const SpecCheck check(spec);
  if (to_string(spec.kind) == "unknown")
    fail(ErrorCode::invalid_argument, "optimizer kind {} is unknown", static_cast<int>(spec.kind));
  check.non_negative("lr", spec.lr);
  if (spec.kind != OptimizerKind::adam_tf) check.non_negative("weight_decay", spec.weight_decay);
  switch (spec.kind) {
    case OptimizerKind::sgd:
      return;
    case OptimizerKind::momentum:
      return validate_momentum(check, spec);
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::adam_tf:
      return validate_adam(check, spec);
    case OptimizerKind::adagrad:
      return validate_adagrad(check, spec);
    case OptimizerKind::rmsprop:
      return validate_rmsprop(check, spec);
  }
}

}  // namespace psched::optim
