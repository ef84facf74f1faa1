// SPDX-License-Identifier: Apache-2.0
#include "common/kj_error.h"

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

kj::Exception to_kj_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    auto text = fmt::format("[{}] {}", to_string(e.code()), e.what());
    return kj::Exception(kj_type(category(e.code())), __FILE__, __LINE__,
                         kj::heapString(text.data(), text.size()));
  } catch (const kj::Exception& e) {
    return e;
  } catch (const std::exception& e) {
    auto text = fmt::format("[internal] {}", e.what());
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                         kj::heapString(text.data(), text.size()));
  }
}

Error from_kj_exception(const kj::Exception& exception) {
  std::string_view text(exception.getDescription().cStr());
  if (auto open = text.find('['); open != std::string_view::npos) {
    auto close = text.find("] ", open);
    ErrorCode code;
    if (close != std::string_view::npos &&
        parse_error_code(text.substr(open + 1, close - open - 1), code))
      return Error(code, std::string(text.substr(close + 2)));
  }
  if (exception.getType() == kj::Exception::Type::DISCONNECTED)
    return Error(ErrorCode::disconnected, fmt::format("connection to the shard lost: {}", text));
  if (exception.getType() == kj::Exception::Type::OVERLOADED)
    return Error(ErrorCode::overloaded, std::string(text));
  if (exception.getType() == kj::Exception::Type::UNIMPLEMENTED)
    return Error(ErrorCode::unimplemented, std::string(text));
  return Error(ErrorCode::internal, std::string(text));
}

}  // namespace psched
