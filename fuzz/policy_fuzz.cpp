// Fuzz target: opforge::Policy::parse (the grammar shared by OPFORGE_OPS, --ops and config files).
// Properties beyond "no crash": a parsed policy's canonical text parses again to the same text,
// and validating against the real registry either passes or throws opforge::Error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "opforge/error.h"
#include "opforge/policy.h"
#include "opforge/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  opforge::Policy policy;
  try {
    policy = opforge::Policy::parse(text, "fuzz");
  } catch (const opforge::Error&) {
    return 0;  // rejected input: expected
  }
  const std::string canonical = policy.str();
  try {
    const std::string again = opforge::Policy::parse(canonical, "fuzz").str();
    if (again != canonical) {
      std::fprintf(stderr, "canonical text does not round trip:\n  %s\n  %s\n", canonical.c_str(),
                   again.c_str());
      __builtin_trap();
    }
  } catch (const opforge::Error& e) {
    std::fprintf(stderr, "canonical text '%s' does not parse: %s\n", canonical.c_str(), e.what());
    __builtin_trap();
  }
  for (const opforge::PolicyRule& rule : policy.rules()) (void)policy.ruling(rule.op);
  try {
    policy.validate(opforge::global_registry());
  } catch (const opforge::Error&) {
  }
  return 0;
}
