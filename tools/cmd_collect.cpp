// opforge collect: time every kernel of a device over the model-shaped grids and write the
// performance database data/perf/<system>/<op>.csv (opforge/collect.h, opforge/perfdb.h).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "opforge/collect.h"
#include "opforge/registry.h"
#include "tools/cli.h"

namespace opforge::cli {

void add_collect(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand(
      "collect", "time every kernel over model-shaped grids into data/perf/<system>/<op>.csv "
                 "(resumes an interrupted run)");
  struct Flags {
    std::string system, grid = "quick", device = "cpu", dtype = "bf16", root;
    std::vector<std::string> impls, ops, models, ranges;
    std::vector<int64_t> tp;
    int samples = 0;  // 0: the device's default (perfdb::CollectOptions::samples)
    int passes = 0;   // 0: the device's default (perfdb::CollectOptions::passes)
    bool dry_run = false;
    bool replace = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("op", f->ops, "ops to collect (default: every op with a grid)");
  cmd->add_option("--system", f->system, "name of the system: the folder under the root")->required();
  cmd->add_option("--grid", f->grid, "quick or full")->check(CLI::IsMember({"quick", "full"}));
  cmd->add_option("--device", f->device, "cpu or cuda (cuda:N for another card)");
  cmd->add_option("--dtype", f->dtype, "dtype of the floating tensors (default bf16)");
  cmd->add_option("--root", f->root, "folder holding <system>/ (default: $OPFORGE_PERF_DATA, else data/perf)");
  cmd->add_option("--impl", f->impls, "only these kernels (default: every non-reference kernel of the device); repeatable");
  cmd->add_option("--model", f->models, "only the shapes of these grid models (e.g. Llama-3.1-8B); repeatable");
  cmd->add_option("--tp", f->tp, "only these tensor-parallel degrees; repeatable");
  cmd->add_option("--range", f->ranges,
                  "only points with dim NAME in [LO, HI], as NAME=LO:HI (e.g. tokens=1:4096); repeatable");
  cmd->add_option("--samples", f->samples, "timed samples per point (default: 400 on the CPU, 5 on a GPU)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--passes", f->passes,
                  "passes over each line of the grid, the fastest pass kept (default: 3 on the CPU, 1 on a GPU)")
      ->check(CLI::Range(1, 10));
  cmd->add_flag("--replace", f->replace,
                "measure the selected points again although the files hold them (their old rows are dropped, the "
                "others kept; the header records it)");
  cmd->add_flag("--dry-run", f->dry_run, "measure the ceilings and list what would be measured; write nothing");
  cmd->callback([f, &status] {
    const Registry& reg = global_registry();
    perfdb::CollectOptions o;
    o.system = f->system;
    o.grid = f->grid;
    const Device dev = parse_device(f->device);
    o.device = dev.kind;
    o.device_index = dev.index;
    o.dtype = dtype_name(parse_dtype(f->dtype));
    o.root = f->root;
    o.impls = f->impls;
    o.models = f->models;
    o.tp = f->tp;
    for (const std::string& r : f->ranges) {
      const size_t eq = r.find('=');
      const auto lo_hi = eq != std::string::npos && eq > 0 ? parse_int_pair(r.substr(eq + 1), ':') : std::nullopt;
      if (!lo_hi) throw Error(ErrorCode::invalid_argument, "--range '" + r + "': expected NAME=LO:HI, e.g. tokens=1:4096");
      if (o.ranges.count(r.substr(0, eq)))
        throw Error(ErrorCode::invalid_argument, "--range: '" + r.substr(0, eq) + "' given twice");
      o.ranges[r.substr(0, eq)] = {lo_hi->first, lo_hi->second};
    }
    o.ops = f->ops;
    o.dry_run = f->dry_run;
    o.replace = f->replace;
    o.progress = isatty(2);
    o.samples = f->samples;
    o.passes = f->passes;
    for (const std::string& impl : o.impls) {
      bool known = false;
      for (const OpEntry* op : reg.ops())
        for (const std::string& name : op->impl_names()) known |= name == impl;
      if (!known) throw Error(ErrorCode::unknown_name, "unknown impl '" + impl + "' (see opforge list)");
    }
    perfdb::CollectSummary s = perfdb::collect(reg, o);
    std::printf("device: %s\nceilings: copy %.1f GB/s, GEMM %.1f GFLOP/s\n", s.device_name.c_str(),
                s.ceiling_gbps, s.ceiling_gflops);
    if (s.ceiling_gflops_end > 0) std::printf("GEMM ceiling again at the end: %.1f GFLOP/s\n", s.ceiling_gflops_end);
    std::printf("measured %d rows, %d already present, %d grid points over the cap, %d not measured, "
                "in %.0f s\n", s.measured, s.already_present, s.capped, s.not_applicable, s.seconds);
    for (const std::string& file : s.files) std::printf("  %s\n", file.c_str());
    status = 0;
  });
}

}  // namespace opforge::cli
