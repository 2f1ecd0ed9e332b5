// Policy grammar, sources and per-op rulings. docs/kernel-selection.md is the user's guide.
#include "opforge/policy.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "opforge/error.h"
#include "opforge/registry.h"

namespace opforge {

namespace {

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

[[noreturn]] void bad_item(std::string_view item, std::string_view source, std::string_view why) {
  throw Error(ErrorCode::parse, "policy item '" + std::string(item) + "' (from " + std::string(source) +
                                    "): " + std::string(why) +
                                    "; expected all, none, strict, fallback, +op, -op or op=impl[|impl...]");
}

PolicyRule parse_item(std::string_view item, std::string_view source) {
  PolicyRule r{};
  r.text = std::string(item);
  r.source = std::string(source);
  if (item == "all") { r.kind = PolicyRule::Kind::all; return r; }
  if (item == "none") { r.kind = PolicyRule::Kind::none; return r; }
  if (item == "strict" || item == "fallback") {
    r.kind = PolicyRule::Kind::mode;
    r.mode = item == "strict" ? PolicyMode::strict : PolicyMode::fallback;
    return r;
  }
  if (item[0] == '+' || item[0] == '-') {
    std::string_view op = item.substr(1);
    if (!is_name(op)) bad_item(item, source, "not an op name after '" + std::string(1, item[0]) + "'");
    r.kind = item[0] == '+' ? PolicyRule::Kind::enable_op : PolicyRule::Kind::disable_op;
    r.op = std::string(op);
    return r;
  }
  size_t eq = item.find('=');
  if (eq == std::string_view::npos) bad_item(item, source, "unknown item");
  std::string_view op = item.substr(0, eq);
  if (!is_name(op)) bad_item(item, source, "not an op name before '='");
  r.kind = PolicyRule::Kind::force;
  r.op = std::string(op);
  std::string_view rest = item.substr(eq + 1);
  while (true) {
    size_t bar = rest.find('|');
    std::string_view impl = rest.substr(0, bar);
    if (!is_name(impl)) bad_item(item, source, "empty or malformed impl name");
    r.impls.emplace_back(impl);
    if (bar == std::string_view::npos) break;
    rest = rest.substr(bar + 1);
  }
  return r;
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

Policy Policy::parse(std::string_view spec, std::string_view source) {
  Policy p;
  size_t i = 0;
  while (i < spec.size()) {
    while (i < spec.size() && (spec[i] == ',' || std::isspace(static_cast<unsigned char>(spec[i])))) ++i;
    size_t j = i;
    while (j < spec.size() && spec[j] != ',' && !std::isspace(static_cast<unsigned char>(spec[j]))) ++j;
    if (j > i) p.rules_.push_back(parse_item(spec.substr(i, j - i), source));
    i = j;
  }
  return p;
}

Policy Policy::from_json(std::string_view text, std::string_view source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::parse, "policy config " + std::string(source) + ": invalid JSON: " + e.what());
  }
  auto fail = [&](const std::string& why) -> Policy {
    throw Error(ErrorCode::parse, "policy config " + std::string(source) + ": " + why +
                                      R"( (expected {"ops": "spec" or ["item", ...], "mode": "strict"|"fallback"}))");
  };
  if (!doc.is_object()) return fail("the top level is not an object");
  Policy p;
  for (const auto& [key, value] : doc.items()) {
    if (key == "ops") {
      if (value.is_string()) {
        p = p.then(parse(value.get<std::string>(), source));
      } else if (value.is_array()) {
        for (const auto& item : value) {
          if (!item.is_string()) return fail("\"ops\" holds a non-string item");
          p = p.then(parse(item.get<std::string>(), source));
        }
      } else {
        return fail("\"ops\" is neither a string nor an array");
      }
    } else if (key == "mode") {
      if (!value.is_string() || (value != "strict" && value != "fallback"))
        return fail("\"mode\" must be \"strict\" or \"fallback\"");
      p = p.then(parse(value.get<std::string>(), source));
    } else {
      return fail("unknown key \"" + key + "\"");
    }
  }
  return p;
}

Policy Policy::from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::io, "policy config " + path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), "config file " + path);
}

Policy Policy::from_sources(const std::string& config_path, std::string_view cli_spec,
                            std::string_view cli_source) {
  Policy p;
  std::string path = config_path;
  if (path.empty())
    if (const char* env = std::getenv("OPFORGE_CONFIG")) path = env;
  if (!path.empty()) p = p.then(from_json_file(path));
  if (const char* env = std::getenv("OPFORGE_OPS")) p = p.then(parse(env, "OPFORGE_OPS"));
  if (!cli_spec.empty()) p = p.then(parse(cli_spec, cli_source));
  return p;
}

Policy Policy::then(const Policy& later) const {
  Policy p = *this;
  p.rules_.insert(p.rules_.end(), later.rules_.begin(), later.rules_.end());
  return p;
}

OpRuling Policy::ruling(std::string_view op) const {
  OpRuling r;
  for (const PolicyRule& rule : rules_) {
    switch (rule.kind) {
      case PolicyRule::Kind::all:
      case PolicyRule::Kind::none:
        r.optimized = rule.kind == PolicyRule::Kind::all;
        r.forced.clear();
        r.rule = &rule;
        break;
      case PolicyRule::Kind::enable_op:
      case PolicyRule::Kind::disable_op:
        if (rule.op != op) break;
        r.optimized = rule.kind == PolicyRule::Kind::enable_op;
        r.forced.clear();
        r.rule = &rule;
        break;
      case PolicyRule::Kind::force:
        if (rule.op != op) break;
        r.optimized = true;
        r.forced = rule.impls;
        r.rule = &rule;
        break;
      case PolicyRule::Kind::mode:
        r.mode = rule.mode;
        r.mode_rule = &rule;
        break;
    }
  }
  return r;
}

void Policy::validate(const Registry& registry) const {
  for (const PolicyRule& rule : rules_) {
    if (rule.op.empty()) continue;
    const OpEntry* op = registry.find(rule.op);
    if (!op)
      throw Error(ErrorCode::unknown_name, "policy item '" + rule.text + "' (from " + rule.source +
                                               "): unknown op '" + rule.op + "'; valid ops: " +
                                               join(registry.op_names()));
    for (const std::string& impl : rule.impls) {
      std::vector<std::string> valid = op->impl_names();
      if (std::find(valid.begin(), valid.end(), impl) == valid.end())
        throw Error(ErrorCode::unknown_name, "policy item '" + rule.text + "' (from " + rule.source +
                                                 "): op '" + rule.op + "' has no impl '" + impl +
                                                 "'; valid impls: " + join(valid));
    }
  }
}

std::string Policy::str() const {
  if (rules_.empty()) return "all";  // the built-in default; parses back to the same ruling
  std::string s;
  for (const PolicyRule& r : rules_) s += (s.empty() ? "" : ",") + r.text;
  return s;
}

}  // namespace opforge
