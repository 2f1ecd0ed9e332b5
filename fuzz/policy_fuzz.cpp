// Fuzz target: opforge::Policy::parse (the grammar shared by OPFORGE_OPS, --ops and config files).
// Properties beyond "no crash": a parsed policy's text (str()) parses again to the same rules,
// and validating against the real registry either passes or throws opforge::Error. (A policy
// without rules prints as "all (built-in default)", a description rather than a spec: skipped.)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "opforge/error.h"
#include "opforge/policy.h"
#include "opforge/registry.h"

namespace {

bool same_rules(const opforge::PolicyRule& a, const opforge::PolicyRule& b) {
  return a.kind == b.kind && a.op == b.op && a.impls == b.impls && a.mode == b.mode;
}

void check_round_trip(const opforge::Policy& policy) {
  const std::string text = policy.str();
  try {
    const opforge::Policy again = opforge::Policy::parse(text, "fuzz");
    const auto& a = policy.rules();
    const auto& b = again.rules();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = same_rules(a[i], b[i]);
    if (!same) {
      std::fprintf(stderr, "policy text does not round trip: '%s' -> '%s'\n", text.c_str(),
                   again.str().c_str());
      __builtin_trap();
    }
  } catch (const opforge::Error& e) {
    std::fprintf(stderr, "policy text '%s' does not parse: %s\n", text.c_str(), e.what());
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  opforge::Policy policy;
  try {
    policy = opforge::Policy::parse(text, "fuzz");
  } catch (const opforge::Error&) {
    return 0;  // rejected input: expected
  }
  if (!policy.rules().empty()) check_round_trip(policy);
  for (const opforge::PolicyRule& rule : policy.rules()) (void)policy.ruling(rule.op);
  try {
    policy.validate(opforge::global_registry());
  } catch (const opforge::Error&) {
  }
  return 0;
}
