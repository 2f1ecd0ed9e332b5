// Policy: which kernels an op may use. See docs/kernel-selection.md for the whole story.
//
// Grammar (items separated by ',' or whitespace):
//   all            optimized kernels on for every op (the built-in default)
//   none           reference kernels only, for every op
//   +op            optimized kernels on for one op
//   -op            reference only for one op
//   op=impl|impl   force this order of impls for one op
//   strict         a forced kernel that cannot run is an error
//   fallback       a forced kernel that cannot run passes to the next candidate, warning once
//
// Sources, in rising precedence: built-in default, JSON config file, OPFORGE_OPS, CLI flag / API.
// Each rule remembers its source so that explain() can name it. Names are validated against a
// registry: an unknown op or impl is an Error listing the valid names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

class Registry;

enum class PolicyMode : uint8_t { fallback, strict };

struct PolicyRule {
  enum class Kind : uint8_t { all, none, enable_op, disable_op, force, mode };
  Kind kind;
  std::string op;                  // enable_op / disable_op / force
  std::vector<std::string> impls;  // force
  PolicyMode mode = PolicyMode::fallback;  // mode
  std::string text;                // the item as written
  std::string source;              // "default", "config file x.json", "OPFORGE_OPS", "--ops", "api"
};

// What the rules say for one op.
struct OpRuling {
  bool optimized = true;
  std::vector<std::string> forced;  // empty: not forced
  PolicyMode mode = PolicyMode::fallback;
  const PolicyRule* rule = nullptr;       // the rule that decided optimized/forced (null: default)
  const PolicyRule* mode_rule = nullptr;  // the rule that set the mode (null: default)
};

class Policy {
 public:
  Policy() = default;  // == "all", fallback
  // Throws Error(parse) on grammar errors, naming the item and its source.
  static Policy parse(std::string_view spec, std::string_view source = "api");
  // JSON config: {"ops": "all,-rms_norm"} or {"ops": ["all", "-rms_norm"], "mode": "strict"}.
  static Policy from_json(std::string_view json_text, std::string_view source);
  static Policy from_json_file(const std::string& path);
  // Layers: built-in default < config file (OPFORGE_CONFIG or `config_path`) < OPFORGE_OPS < cli.
  static Policy from_sources(const std::string& config_path = {}, std::string_view cli_spec = {},
                             std::string_view cli_source = "--ops");

  // Rules of `later` override ours (appended after ours).
  Policy then(const Policy& later) const;
  OpRuling ruling(std::string_view op) const;
  void validate(const Registry& registry) const;  // unknown op / impl names -> Error
  const std::vector<PolicyRule>& rules() const { return rules_; }
  std::string str() const;  // canonical spec text

 private:
  std::vector<PolicyRule> rules_;
};

}  // namespace opforge
