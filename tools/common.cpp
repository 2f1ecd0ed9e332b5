#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "tools/cli.h"

namespace opforge::cli {

Policy Common::policy() const {
  Policy p = Policy::from_sources(config, ops, "--ops");
  p.validate(global_registry());
  return p;
}

void add_common(CLI::App& cmd, Common& common) {
  cmd.add_option("--ops", common.ops, "kernel policy, e.g. 'all,-rms_norm' or 'rms_norm=cpu,strict' "
                                      "(overrides OPFORGE_OPS and the config file)");
  cmd.add_option("--config", common.config, "JSON policy config (default: $OPFORGE_CONFIG)");
}

void add_harness_flags(CLI::App& cmd, HarnessFlags& f) {
  add_common(cmd, f.common);
  cmd.add_option("op", f.ops, "ops to run (default: all)");
  cmd.add_option("--backend", f.backends, "impl names or devices (reference, cpu, cuda, ...); repeatable");
  cmd.add_option("--dtype", f.dtypes, "dtypes (f32, f16, bf16, f64); repeatable");
  cmd.add_option("--group", f.groups, "case groups (small, medium, large, edge, training: only when named); repeatable");
  cmd.add_option("--case", f.cases, "case labels to run (exact, e.g. t1024xh4096), whatever their group; repeatable");
  cmd.add_option("--json", f.json, "write results as JSON");
  cmd.add_option("--csv", f.csv, "write results as CSV");
  cmd.add_option("--shard", f.shard, "K/N: only the ops of shard K of N (0 <= K < N, split by op name), "
                                     "to run one check as N processes");
}

std::optional<std::pair<int64_t, int64_t>> parse_int_pair(const std::string& text, char sep) {
  const size_t at = text.find(sep);
  if (at == std::string::npos) return std::nullopt;
  const std::string a = text.substr(0, at), b = text.substr(at + 1);
  try {
    size_t used_a = 0, used_b = 0;
    const int64_t x = std::stoll(a, &used_a), y = std::stoll(b, &used_b);
    if (used_a != a.size() || used_b != b.size()) return std::nullopt;
    return std::make_pair(x, y);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

static CaseGroup parse_group(const std::string& g) {
  for (CaseGroup c : {CaseGroup::small, CaseGroup::medium, CaseGroup::large, CaseGroup::edge, CaseGroup::training})
    if (g == case_group_name(c)) return c;
  throw Error(ErrorCode::unknown_name, "unknown case group '" + g + "'; valid: small, medium, large, edge, training");
}

harness::Options HarnessFlags::options() const {
  harness::Options o;
  o.policy = common.policy();
  const Registry& reg = global_registry();
  for (const std::string& op : ops) reg.op(op);  // unknown op -> Error listing the valid ones
  o.ops = ops;
  for (const std::string& label : cases) {  // a label no selected op has is a typo, not "no results"
    std::string valid;
    bool found = false;
    for (const OpEntry* op : reg.ops()) {
      if (!op->cases || (!ops.empty() && std::find(ops.begin(), ops.end(), op->name) == ops.end())) continue;
      for (const Case& c : op->cases()) {
        found |= c.label == label;
        if (!ops.empty()) valid += (valid.empty() ? "" : ", ") + c.label;
      }
    }
    if (!found)
      throw Error(ErrorCode::unknown_name, "unknown case '" + label + "'" +
                                               (valid.empty() ? std::string("; name the op to list its cases") : "; valid: " + valid));
  }
  for (const std::string& b : backends) {
    bool known = b == "cpu" || b == "cuda";
    for (const OpEntry* op : reg.ops())
      for (const std::string& impl : op->impl_names()) known |= impl == b;
    if (!known) throw Error(ErrorCode::unknown_name, "unknown backend '" + b + "'; valid: cpu, cuda or an impl name (see opforge list)");
  }
  o.backends = backends;
  for (const std::string& d : dtypes) o.dtypes.push_back(parse_dtype(d));
  for (const std::string& g : groups) o.groups.push_back(parse_group(g));
  o.cases = cases;
  if (!shard.empty()) {
    // "K/N" with 0 <= K < N <= 1000; anything else names what was expected.
    const auto kn = parse_int_pair(shard, '/');
    const int64_t k = kn ? kn->first : -1, n = kn ? kn->second : 0;
    if (k < 0 || n < 1 || n > 1000 || k >= n)
      throw Error(ErrorCode::parse,
                  "argument '--shard': expected K/N with 0 <= K < N <= 1000, got '" + shard + "'");
    o.shard_index = int(k);
    o.shard_count = int(n);
  }
  o.progress = isatty(2);
  return o;
}

void print_and_save(const harness::Report& report, const HarnessFlags& f) {
  std::cout << harness::format_table(report);
  if (!f.json.empty()) harness::write_json(report, f.json);
  if (!f.csv.empty()) harness::write_csv(report, f.csv);
}

}  // namespace opforge::cli
