// opforge check: harness test + grad modes. opforge bench: perf mode.
#include <iostream>
#include <memory>

#include "opforge/harness.h"
#include "opforge/registry.h"
#include "tools/cli.h"

namespace opforge::cli {

void add_check(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("check", "prove kernels against the reference (test) and gradients (grad)");
  auto flags = std::make_shared<HarnessFlags>();
  auto mode = std::make_shared<std::string>("all");
  add_harness_flags(*cmd, *flags);
  auto fuzz = std::make_shared<int>(0);
  auto seed = std::make_shared<uint64_t>(harness::Options{}.fuzz_seed);
  cmd->add_option("--mode", *mode, "test, grad or all")->check(CLI::IsMember({"test", "grad", "all"}));
  cmd->add_option("--fuzz", *fuzz, "N random cases per op derived from its declared ones (small, medium, "
                                    "edge) instead of those cases")->check(CLI::Range(1, 100000));
  cmd->add_option("--seed", *seed, "seed of the --fuzz draws (default: a fixed one, so runs repeat)");
  cmd->callback([=, &status] {
    harness::Options o = flags->options();
    o.fuzz = *fuzz;
    o.fuzz_seed = *seed;
    const Registry& reg = global_registry();
    harness::Report rep;
    if (*mode != "grad") rep = harness::run_test(reg, o);
    if (*mode != "test") {
      harness::Report g = harness::run_grad(reg, o);
      rep.results.insert(rep.results.end(), g.results.begin(), g.results.end());
      rep.date = g.date;
    }
    rep.fuzz = o.fuzz;
    rep.fuzz_seed = o.fuzz_seed;
    print_and_save(rep, *flags);
    status = rep.ok() ? 0 : 1;
  });
}

void add_bench(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("bench", "time kernels: median us, GB/s, GFLOP/s, % of the copy ceiling");
  auto flags = std::make_shared<HarnessFlags>();
  auto no_reference = std::make_shared<bool>(false);
  auto samples = std::make_shared<int>(5);
  add_harness_flags(*cmd, *flags);
  cmd->add_flag("--no-reference", *no_reference, "do not time reference kernels");
  cmd->add_option("--samples", *samples, "minimum timed samples per case")->check(CLI::Range(1, 1000));
  cmd->callback([=, &status] {
    harness::Options o = flags->options();
    o.perf_reference = !*no_reference;
    o.perf_min_samples = *samples;
    o.perf_max_samples = std::max(*samples, o.perf_max_samples);
    harness::Report rep = harness::run_perf(global_registry(), o);
    print_and_save(rep, *flags);
    status = rep.ok() ? 0 : 1;
  });
}

}  // namespace opforge::cli
