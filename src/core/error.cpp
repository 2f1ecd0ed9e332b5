#include "opforge/error.h"

#include <string>

namespace opforge {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::unknown_name: return "unknown_name";
    case ErrorCode::not_available: return "not_available";
    case ErrorCode::io: return "io";
    case ErrorCode::parse: return "parse";
    case ErrorCode::backend: return "backend";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

void throw_argument_error(std::string_view op, std::string_view arg, std::string_view expected,
                          std::string_view actual) {
  std::string msg;
  msg.append(op).append(": argument '").append(arg).append("': expected ");
  msg.append(expected).append(", got ").append(actual);
  throw Error(ErrorCode::invalid_argument, msg);
}

}  // namespace opforge
