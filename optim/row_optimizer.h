// SPDX-License-Identifier: Apache-2.0
// The optimizers of embedding-table rows: one update of one row from its (coalesced) gradient,
// touching nothing but that row. Each is the formula of a named reference, on the rows a step's
// sparse gradient holds:
//   sgd              torch.optim.SGD on a sparse gradient: w += -lr * g
//   adagrad          torch.optim.Adagrad's sparse path: sum += g^2 (the row's elements);
//                    w += -clr * g / (sqrt(sum) + eps), clr = lr / (1 + (t - 1) lr_decay)
//   rowwise_adagrad  FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row,
//                    acc += mean(g^2); w -= lr / (sqrt(acc) + eps) * g
//   sparse_adam      torch.optim.SparseAdam: the moments of the touched rows only, bias
//                    correction from the table's step t (every step counts, touched or not)
// What a row optimizer cannot do is refused by validate_row: weight decay and momentum would
// change rows a step did not touch (torch refuses weight decay on sparse gradients too).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace psched::optim {

enum class RowOptimizerKind {
  sgd,
  adagrad,
  rowwise_adagrad,
  sparse_adam,
};

std::string_view to_string(RowOptimizerKind kind);
// Inverse of to_string; false when `name` names no row optimizer.
bool parse_row_optimizer_kind(std::string_view name, RowOptimizerKind& out);

// Hyper-parameters; each kind reads those its formula names. torch_row_defaults gives torch's
// (FBGEMM's for rowwise_adagrad).
struct RowOptimizerSpec {
  RowOptimizerKind kind = RowOptimizerKind::sgd;
  double lr = 0.01;
  double eps = 1e-10;                      // adagrad (torch's default), rowwise, sparse_adam
  double beta1 = 0.9;                      // sparse_adam
  double beta2 = 0.999;                    // sparse_adam
  double lr_decay = 0.0;                   // adagrad
  double initial_accumulator_value = 0.0;  // adagrad, rowwise_adagrad
  // torch keywords no row optimizer honours: refused unless 0 (validate_row).
  double weight_decay = 0.0;
  double momentum = 0.0;

  bool operator==(const RowOptimizerSpec&) const = default;
};

// torch.optim's defaults for `kind` (1.13): sgd lr 0.01 (torch has none: a caller speaking for
// torch requires one), adagrad lr 0.01 eps 1e-10, sparse_adam lr 1e-3 eps 1e-8; rowwise_adagrad
// FBGEMM's lr 0.01 eps 1e-8.
RowOptimizerSpec torch_row_defaults(RowOptimizerKind kind);

// Throws psched::Error(invalid_argument) naming the field when a hyper-parameter is out of range
// or one no row optimizer honours is set.
void validate_row(const RowOptimizerSpec& spec);

// Elements of optimizer state one row of `dim` elements keeps, in this order:
//   sgd              none
//   adagrad          dim: sum
//   rowwise_adagrad  1: the row's accumulator
//   sparse_adam      2 dim: exp_avg, then exp_avg_sq
uint64_t row_state_elements(const RowOptimizerSpec& spec, uint64_t dim);
// The value each state element starts at (adagrad's and rowwise_adagrad's accumulator:
// initial_accumulator_value; the rest 0).
double initial_row_state(const RowOptimizerSpec& spec);

// What an update of a table's step `t` shares across its rows, computed once a step rather than
// once a row: the learning rate the formula applies (adagrad: clr; sparse_adam: lr with both
// bias corrections folded in, as torch's step_size; the rest: lr).
struct RowStep {
  double lr = 0;
};
RowStep row_step(const RowOptimizerSpec& spec, uint64_t t);

// Updates of rows with the step's shared scalars (row_step(spec, t) for the table's update
// `t`, 1-based), each row as a table keeps it: rows[k] holds a row's `dim` values then its state
// (row_state_elements(spec, dim) elements), updated in place from grads[k] (`dim` elements).
// Each row's result is the same as if it were updated alone: rowwise_adagrad sums the squares
// of four rows side by side, each row's in its own order.
void apply_rows(const RowOptimizerSpec& spec, const RowStep& step, uint64_t dim,
                std::span<float* const> rows, std::span<const float* const> grads);
void apply_rows(const RowOptimizerSpec& spec, const RowStep& step, uint64_t dim,
                std::span<double* const> rows, std::span<const double* const> grads);

}  // namespace psched::optim
