#include "opforge/value.h"

#include <charconv>
#include <cmath>
#include <string>

#include "opforge/error.h"

namespace opforge {

const char* arg_type_name(ArgType t) {
  switch (t) {
    case ArgType::tensor: return "tensor";
    case ArgType::i64: return "int";
    case ArgType::f64: return "float";
    case ArgType::boolean: return "bool";
    case ArgType::string: return "string";
  }
  return "?";
}

const char* value_type_name(const Value& v) {
  static const char* names[] = {"none", "tensor", "int", "float", "bool", "string"};
  return names[v.index()];
}

std::string value_str(const Value& v) {
  struct Visitor {
    std::string operator()(None) const { return "none"; }
    std::string operator()(const TensorView& t) const { return t.str(); }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char buf[32];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
      return std::string(buf, end);
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
  };
  return std::visit(Visitor{}, v);
}

const char* arg_role_name(ArgRole r) {
  switch (r) {
    case ArgRole::in: return "in";
    case ArgRole::opt_in: return "optional in";
    case ArgRole::out: return "out";
    case ArgRole::inout: return "inout";
    case ArgRole::scalar: return "scalar";
  }
  return "?";
}

size_t ArgList::index_of(std::string_view name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return i;
  throw Error(ErrorCode::internal, std::string(op_) + ": no argument named '" + std::string(name) + "'");
}

const Value& ArgList::operator[](std::string_view name) const {
  size_t i = index_of(name);
  if (i >= values_.size())
    throw Error(ErrorCode::internal, std::string(op_) + ": argument '" + std::string(name) + "' was not given");
  return values_[i];
}

template <class T>
static const T& expect(const ArgList& args, std::string_view name, const char* what) {
  const Value& v = args[name];
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw_argument_error(args.op(), name, what, value_type_name(v));
}

const TensorView& ArgList::tensor(std::string_view name) const {
  return expect<TensorView>(*this, name, "a tensor");
}
int64_t ArgList::i64(std::string_view name) const { return expect<int64_t>(*this, name, "an int"); }
double ArgList::f64(std::string_view name) const {
  const Value& v = (*this)[name];
  if (const int64_t* i = std::get_if<int64_t>(&v)) return double(*i);
  return expect<double>(*this, name, "a float");
}
bool ArgList::boolean(std::string_view name) const { return expect<bool>(*this, name, "a bool"); }
std::string_view ArgList::str(std::string_view name) const {
  return expect<std::string>(*this, name, "a string");
}
bool ArgList::is_none(std::string_view name) const {
  return std::holds_alternative<None>((*this)[name]);
}

Value parse_scalar_literal(std::string_view op, const ArgInfo& arg, std::string_view text) {
  auto bad = [&](const char* what) -> Value {
    throw Error(ErrorCode::parse, std::string(op) + ": argument '" + arg.name + "': expected " + what +
                                      ", got '" + std::string(text) + "'");
  };
  const char* b = text.data();
  const char* e = text.data() + text.size();
  switch (arg.type) {
    case ArgType::i64: {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(b, e, v);
      if (ec != std::errc() || end != e || text.empty()) return bad("an integer");
      return v;
    }
    case ArgType::f64: {
      double v = 0;
      auto [end, ec] = std::from_chars(b, e, v);
      if (ec != std::errc() || end != e || text.empty()) return bad("a number");
      return v;
    }
    case ArgType::boolean:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      return bad("true or false");
    case ArgType::string: return std::string(text);
    case ArgType::tensor: return bad("a tensor (.npy path), not a literal");
  }
  return bad("a value");
}

}  // namespace opforge
