// SPDX-License-Identifier: Apache-2.0
#include "common/error.h"

#include <array>
#include <utility>

namespace psched {
namespace {

constexpr std::array<std::pair<ErrorCode, std::string_view>, kErrorCodeCount> kNames{{
    {ErrorCode::unknown_variable, "unknown_variable"},
    {ErrorCode::shape_mismatch, "shape_mismatch"},
    {ErrorCode::dtype_mismatch, "dtype_mismatch"},
    {ErrorCode::offset_out_of_range, "offset_out_of_range"},
    {ErrorCode::step_from_future, "step_from_future"},
    {ErrorCode::stale_step, "stale_step"},
    {ErrorCode::spec_conflict, "spec_conflict"},
    {ErrorCode::bad_token, "bad_token"},
    {ErrorCode::message_too_large, "message_too_large"},
    {ErrorCode::invalid_argument, "invalid_argument"},
    {ErrorCode::bad_config, "bad_config"},
    {ErrorCode::corrupt_checkpoint, "corrupt_checkpoint"},
    {ErrorCode::sync_timeout, "sync_timeout"},
    {ErrorCode::not_a_member, "not_a_member"},
    {ErrorCode::overloaded, "overloaded"},
    {ErrorCode::disconnected, "disconnected"},
    {ErrorCode::unimplemented, "unimplemented"},
    {ErrorCode::io_error, "io_error"},
    {ErrorCode::read_only, "read_only"},
    {ErrorCode::internal, "internal"},
}};

}  // namespace

std::string_view to_string(ErrorCode code) {
  for (auto& [c, name] : kNames)
    if (c == code) return name;
  return "unknown";
}

Error to_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(ErrorCode::internal, e.what());
  } catch (...) {
    return Error(ErrorCode::internal, "an exception that is not a std::exception");
  }
}

bool parse_error_code(std::string_view name, ErrorCode& out) {
  for (auto& [c, n] : kNames) {
    if (n == name) {
      out = c;
      return true;
    }
  }
  return false;
}

}  // namespace psched
