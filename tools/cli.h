// Shared pieces of the `opforge` command-line tool: one file per subcommand (tools/cmd_*.cpp).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/estimate.h"
#include "opforge/harness.h"
#include "opforge/policy.h"

namespace opforge::cli {

// Options every subcommand takes.
struct Common {
  std::string ops;     // --ops SPEC
  std::string config;  // --config FILE (else OPFORGE_CONFIG)
  Policy policy() const;  // built-in < config < OPFORGE_OPS < --ops, validated
};
void add_common(CLI::App& cmd, Common& common);

// Each registers its subcommand; the callback runs it and sets the process exit status.
void add_list(CLI::App& app, int& status);
void add_explain(CLI::App& app, int& status);
void add_call(CLI::App& app, int& status);
void add_check(CLI::App& app, int& status);
void add_bench(CLI::App& app, int& status);
void add_support(CLI::App& app, int& status);
void add_perfdb(CLI::App& app, int& status);  // tools/cmd_perfdb.cpp
void add_collect_comm(CLI::App& app, int& status);  // tools/cmd_comm.cpp
void add_estimate(CLI::App& app, int& status);
void add_run_layer(CLI::App& app, int& status);

// --interp's names: floor (fixed cost plus power law, else the monotone cubic; the default),
// cubic (monotone cubic in log-log), linear (log time linear in log axis between the neighbours).
inline perfdb::Interpolation interpolation_named(const std::string& name) {
  return name == "linear"  ? perfdb::Interpolation::log_linear
         : name == "cubic" ? perfdb::Interpolation::monotone_cubic
                           : perfdb::Interpolation::floor_power;
}
inline const char* kInterpHelp =
    "interpolation along one axis: floor (time = fixed cost + b * axis^p through the neighbours and the "
    "next point on either side, else the monotone cubic; the default), cubic (monotone cubic in log-log) "
    "or linear (log time linear in log axis between the two neighbours)";

// Model and workload flags of estimate, support --model and run-layer (tools/cmd_estimate.cpp).
struct ModelFlags {
  std::string model, system, root;
  int64_t tp = 1, batch = 1, input_len = 1024, output_len = 128;
  std::string dtype = "bf16";
  std::string impl = "auto";
  std::string interp = "floor";  // the database's interpolation along one axis: floor, cubic or linear
  model::EstimateOptions options() const;
  perfdb::Database load_db() const;  // Database::load(system, root) with `interp` set
};
void add_model_flags(CLI::App& cmd, ModelFlags& flags);
// `opforge support --model M --system S`: prints the table; 0 when every call has data, else 1.
int run_model_support(const ModelFlags& flags);
void add_collect(CLI::App& app, int& status);

// Harness options shared by check and bench.
struct HarnessFlags {
  Common common;
  std::vector<std::string> ops;
  std::vector<std::string> backends;
  std::vector<std::string> dtypes;
  std::vector<std::string> groups;
  std::vector<std::string> cases;
  std::string json, csv;
  std::string shard;  // "K/N", see harness::Options::shard_index
  harness::Options options() const;
};
void add_harness_flags(CLI::App& cmd, HarnessFlags& flags);
// "A<sep>B" with A and B whole integers (nothing else around them), else nullopt.
std::optional<std::pair<int64_t, int64_t>> parse_int_pair(const std::string& text, char sep);
void print_and_save(const harness::Report& report, const HarnessFlags& flags);

}  // namespace opforge::cli
