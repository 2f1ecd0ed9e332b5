// opforge::Error — the one exception type of the library.
//
// Every check that rejects user input throws an Error whose message names the op, the argument,
// what was expected and what was found, e.g.
//   rms_norm: argument 'w': expected shape [4096], got [4095]
// Kernels never call exit() or abort(); the CLI turns an Error into one line and a non-zero status.
#pragma once

#include <stdexcept>
#include <string>

namespace opforge {

enum class ErrorCode {
  invalid_argument,  // shapes, dtypes, devices, aliasing, values out of range
  unknown_name,      // an op, impl, dtype or device name that does not exist
  not_available,     // no kernel can run (strict policy, missing backend)
  io,                // files: npy, config
  parse,             // policy grammar, JSON, CLI literals
  backend,           // a CUDA/driver call failed
  internal,          // a broken invariant of opforge itself
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// "<op>: argument '<arg>': expected <expected>, got <actual>"
[[noreturn]] void throw_argument_error(std::string_view op, std::string_view arg,
                                       std::string_view expected, std::string_view actual);

}  // namespace opforge
