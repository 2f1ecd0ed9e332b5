// Fuzz target: opforge::Policy::from_json (config files). Malformed JSON, wrong types and bad
// policy items must all surface as opforge::Error; a JSON library exception escaping is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "opforge/error.h"
#include "opforge/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    opforge::Policy policy = opforge::Policy::from_json(text, "fuzz.json");
    (void)policy.str();
    for (const opforge::PolicyRule& rule : policy.rules()) (void)policy.ruling(rule.op);
  } catch (const opforge::Error&) {
  }
  return 0;
}
