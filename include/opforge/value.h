// Boxed values: how every op is called by name (CLI, harness, collector, Python front).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "opforge/tensor.h"

namespace opforge {

struct None {
  friend bool operator==(None, None) { return true; }
};

// A tensor is boxed as a view: the caller owns the memory (Tensor) for the call's duration.
using Value = std::variant<None, TensorView, int64_t, double, bool, std::string>;

enum class ArgType : uint8_t { tensor, i64, f64, boolean, string };
const char* arg_type_name(ArgType t);
const char* value_type_name(const Value& v);  // "none", "tensor", "int", "float", "bool", "string"
std::string value_str(const Value& v);        // for traces and error messages

// How an argument is used. Outputs are written by the kernel and allocated by the caller from the
// op's shape function; `inout` is read and written in place; `opt_in` may be None.
enum class ArgRole : uint8_t { in, opt_in, out, inout, scalar };
const char* arg_role_name(ArgRole r);

// Static description of one argument, written next to the op's Signature.
struct ArgSpec {
  const char* name;
  ArgRole role;
  const char* default_value = nullptr;  // scalar literal used when a boxed call omits it
};

// One argument of an op as the registry sees it: spec + type derived from the typed signature.
struct ArgInfo {
  std::string name;
  ArgRole role;
  ArgType type;
  std::string default_value;  // empty: required
  bool has_default = false;
};

// Boxed arguments by position, with lookup by name for shape functions, cost models and cases.
class ArgList {
 public:
  ArgList(std::string_view op, std::span<const ArgInfo> infos, std::span<const Value> values)
      : op_(op), infos_(infos), values_(values) {}
  const Value& operator[](std::string_view name) const;
  const TensorView& tensor(std::string_view name) const;  // Error if not a tensor
  int64_t i64(std::string_view name) const;
  double f64(std::string_view name) const;  // accepts int too
  bool boolean(std::string_view name) const;
  std::string_view str(std::string_view name) const;
  bool is_none(std::string_view name) const;
  std::span<const Value> values() const { return values_; }
  std::span<const ArgInfo> infos() const { return infos_; }
  std::string_view op() const { return op_; }

 private:
  size_t index_of(std::string_view name) const;
  std::string_view op_;
  std::span<const ArgInfo> infos_;
  std::span<const Value> values_;
};

// Parse a CLI scalar literal for an argument of type t ("1e-6", "3", "true", "neox").
Value parse_scalar_literal(std::string_view op, const ArgInfo& arg, std::string_view text);

}  // namespace opforge
