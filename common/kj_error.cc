// SPDX-License-Identifier: Apache-2.0
#include "common/kj_error.h"

#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace psched {
namespace {

kj::Exception::Type kj_type(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::failed:
      return kj::Exception::Type::FAILED;
    case ErrorCategory::overloaded:
      return kj::Exception::Type::OVERLOADED;
    case ErrorCategory::disconnected:
      return kj::Exception::Type::DISCONNECTED;
    case ErrorCategory::unimplemented:
      return kj::Exception::Type::UNIMPLEMENTED;
  }
  return kj::Exception::Type::FAILED;
}

}  // namespace

std::string describe(const Error& error) {
  return fmt::format("[{}] {}", to_string(error.code()), error.what());
}

kj::Exception to_kj_exception(const Error& error) {
  std::string text = describe(error);
  return kj::Exception(kj_type(category(error.code())), __FILE__, __LINE__,
                       kj::heapString(text.data(), text.size()));
}

kj::Exception to_kj_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return to_kj_exception(e);
  } catch (const kj::Exception& e) {
    return e;
  } catch (const std::exception& e) {
    auto text = fmt::format("[internal] {}", e.what());
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                         kj::heapString(text.data(), text.size()));
  }
}

namespace {

// The error `text` describes, when it starts with a code.
std::optional<Error> parse_description(std::string_view text) {
  auto open = text.find('[');
  if (open == std::string_view::npos) return std::nullopt;
  auto close = text.find("] ", open);
  ErrorCode code;
  if (close == std::string_view::npos ||
      !parse_error_code(text.substr(open + 1, close - open - 1), code))
    return std::nullopt;
  return Error(code, std::string(text.substr(close + 2)));
}

}  // namespace

Error from_description(std::string_view text) {
  if (auto error = parse_description(text)) return *error;
  return Error(ErrorCode::internal, std::string(text));
}

Error from_kj_exception(const kj::Exception& exception) {
  std::string_view text(exception.getDescription().cStr());
  if (auto error = parse_description(text)) return *error;
  if (exception.getType() == kj::Exception::Type::DISCONNECTED)
    return Error(ErrorCode::disconnected, fmt::format("connection to the shard lost: {}", text));
  if (exception.getType() == kj::Exception::Type::OVERLOADED)
    return Error(ErrorCode::overloaded, std::string(text));
  if (exception.getType() == kj::Exception::Type::UNIMPLEMENTED)
    return Error(ErrorCode::unimplemented, std::string(text));
  return Error(ErrorCode::internal, std::string(text));
}

}  // namespace psched
