// SPDX-License-Identifier: Apache-2.0
#include "actors/shard/hosted_kinds.h"

#include <utility>

#include "actors/shard/row_table.h"
#include "actors/shard/variable.h"
#include "common/error.h"

namespace psched {
namespace {

class VariableEnrollment final : public Enrollment {
 public:
  VariableEnrollment(VariableSpec spec, ElementRange part, std::span<const std::byte> initial,
                     ForkJoinPool* apply_pool, optim::ComputeDevice* device)
      : spec_(std::move(spec)),
        part_(part),
        initial_(initial),
        apply_pool_(apply_pool),
        device_(device) {}

  const std::string& name() const override { return spec_.name; }

  void check_same(const HostedKind& hosted) const override {
    const auto* existing = dynamic_cast<const Variable*>(&hosted);
    if (existing == nullptr)
      fail(ErrorCode::spec_conflict,
           "register of '{}' rejected: a table of that name is registered", spec_.name);
    if (!existing->spec().same_variable(spec_) || existing->part() != part_)
      fail(ErrorCode::spec_conflict,
           "register of variable '{}' rejected: it is registered with a different spec "
           "(shape, dtype, optimizer or shard part differ)",
           spec_.name);
  }

  void check() const override { Variable::check_part(spec_, part_, initial_); }

  void log(ShardDurability& durability) const override {
    durability.log_register(spec_, part_, initial_);
  }

  std::unique_ptr<HostedKind> make() override {
    return std::make_unique<Variable>(std::move(spec_), part_, initial_, apply_pool_, device_);
  }

 private:
  VariableSpec spec_;
  ElementRange part_;
  std::span<const std::byte> initial_;
  ForkJoinPool* apply_pool_;
  optim::ComputeDevice* device_;
};

class TableEnrollment final : public Enrollment {
 public:
  explicit TableEnrollment(TableSpec spec) : spec_(std::move(spec)) {}

  const std::string& name() const override { return spec_.name; }

  void check_same(const HostedKind& hosted) const override {
    const auto* existing = dynamic_cast<const RowTable*>(&hosted);
    if (existing == nullptr)
      fail(ErrorCode::spec_conflict,
           "register of '{}' rejected: a dense variable of that name is registered", spec_.name);
    if (!existing->spec().same_table(spec_))
      fail(ErrorCode::spec_conflict,
           "register of table '{}' rejected: it is registered with a different spec (rows, "
           "dim, dtype, optimizer, init or seed differ)",
           spec_.name);
  }

  void check() const override { RowTable::check_spec(spec_); }

  void log(ShardDurability& durability) const override { durability.log_register_table(spec_); }

  std::unique_ptr<HostedKind> make() override {
    return std::make_unique<RowTable>(std::move(spec_));
  }

 private:
  TableSpec spec_;
};

}  // namespace

std::unique_ptr<Enrollment> enroll_variable(VariableSpec spec, ElementRange part,
                                            std::span<const std::byte> initial,
                                            ForkJoinPool* apply_pool,
                                            optim::ComputeDevice* device) {
  return std::make_unique<VariableEnrollment>(std::move(spec), part, initial, apply_pool, device);
}

std::unique_ptr<Enrollment> enroll_table(TableSpec spec) {
  return std::make_unique<TableEnrollment>(std::move(spec));
}

void check_same_kind(const HostedKind& served, const HostedKind& next) {
  const auto* variable = dynamic_cast<const Variable*>(&served);
  const auto* next_variable = dynamic_cast<const Variable*>(&next);
  const auto* table = dynamic_cast<const RowTable*>(&served);
  const auto* next_table = dynamic_cast<const RowTable*>(&next);
  if (variable != nullptr && next_variable != nullptr) {
    if (!variable->spec().same_variable(next_variable->spec()) ||
        variable->part() != next_variable->part())
      fail(ErrorCode::spec_conflict,
           "variable '{}' has another spec in the new version (shape, dtype, optimizer or shard "
           "part differ)",
           served.name());
    return;
  }
  if (table != nullptr && next_table != nullptr) {
    if (!table->spec().same_table(next_table->spec()))
      fail(ErrorCode::spec_conflict,
           "table '{}' has another spec in the new version (rows, dim, dtype, optimizer, init or "
           "seed differ)",
           served.name());
    return;
  }
  fail(ErrorCode::spec_conflict, "'{}' is a {} served and a {} in the new version", served.name(),
       table != nullptr ? "table" : "dense variable",
       next_table != nullptr ? "table" : "dense variable");
}

std::unique_ptr<HostedKind> restore_kind(ByteReader& in, ByteSource& rows, ForkJoinPool* apply_pool,
                                         optim::ComputeDevice* device) {
  const auto tag = in.get<uint8_t>();
  switch (static_cast<KindTag>(tag)) {
    case KindTag::variable:
      return std::make_unique<Variable>(Variable::restore(in, apply_pool, device));
    case KindTag::table:
      return std::make_unique<RowTable>(RowTable::restore(in, rows));
  }
  fail(ErrorCode::corrupt_checkpoint, "{}: unknown kind {} of variable", in.what(), tag);
}

}  // namespace psched
