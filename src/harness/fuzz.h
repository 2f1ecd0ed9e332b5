// Fuzz mode of check: random cases derived from an op's declared cases (Note [fuzz derivation]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/harness.h"
#include "opforge/registry.h"

namespace opforge::harness::detail {

// Elements a fuzzed tensor may have (Note [fuzz derivation]: a draw stays cheap).
inline constexpr int64_t kFuzzMaxElements = int64_t(1) << 18;

// The cases a draw may start from: small, medium and edge (never large or training), within
// Options::groups / Options::cases when given, whose tensors all fit kFuzzMaxElements.
std::vector<const Case*> fuzz_bases(const Options& opt, const std::vector<Case>& cases);

// Draw `index` of op `op_name` under `seed`, from `bases` (not empty). The same (seed, op_name,
// index, bases) gives the same case on every machine and whatever the other draws are.
Case fuzz_case(const std::vector<const Case*>& bases, uint64_t seed, const std::string& op_name, int index);

// Options::fuzz draws of `op` (none when the op has no case to start from).
std::vector<Case> fuzz_cases(const Options& opt, const OpEntry& op);

}  // namespace opforge::harness::detail
