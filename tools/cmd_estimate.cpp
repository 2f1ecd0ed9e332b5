// opforge estimate --model NAME|config.json --system S [--tp N] [--batch B] [--input-len L]
//                  [--output-len O] [--dtype bf16] [--impl auto] [--json F] [--root DIR]
//                  [--interp floor|cubic|linear] [--calibrate cpu|cuda:N | --ceilings GBPS,GFLOPS]
// opforge support --model M --system S [same workload flags]: which calls of the model the
// database answers (the model half of `opforge support`, see cmd_list.cpp).
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "model/estimate.h"
#include "opforge/collect.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "opforge/perfdb.h"
#include "tools/cli.h"

namespace opforge::cli {

void add_model_flags(CLI::App& cmd, ModelFlags& f) {
  cmd.add_option("--model", f.model, "a shipped model (data/models/NAME.json) or a path to a config.json");
  cmd.add_option("--system", f.system, "the perf database to use (data/perf/SYSTEM)");
  cmd.add_option("--tp", f.tp, "tensor-parallel degree (per-GPU shapes plus all-reduces)");
  cmd.add_option("--batch", f.batch, "sequences in flight");
  cmd.add_option("--input-len", f.input_len, "prompt tokens per sequence");
  cmd.add_option("--output-len", f.output_len, "generated tokens per sequence (decode runs at input + output/2)");
  cmd.add_option("--dtype", f.dtype, "bf16, f16 or f32");
  cmd.add_option("--impl", f.impl, "kernel the database answers for (auto: the fastest stored)");
  cmd.add_option("--root", f.root, "perf data folder (default: $OPFORGE_PERF_DATA, else this checkout's data/perf)");
  cmd.add_option("--interp", f.interp, kInterpHelp)->check(CLI::IsMember({"floor", "cubic", "linear"}));
}

perfdb::Database ModelFlags::load_db() const {
  perfdb::Database db = perfdb::Database::load(system, root);
  db.set_interpolation(interpolation_named(interp));
  return db;
}

model::EstimateOptions ModelFlags::options() const {
  model::EstimateOptions o;
  o.tp = tp;
  o.batch = batch;
  o.input_len = input_len;
  o.output_len = output_len;
  o.dtype = dtype;
  o.impl = impl;
  return o;
}

int run_model_support(const ModelFlags& f) {
  if (f.system.empty()) throw Error(ErrorCode::invalid_argument, "support --model: --system is required");
  model::ModelSpec m = model::load_model(f.model);
  model::validate_options(m, f.options());
  perfdb::Database db = f.load_db();
  std::vector<model::SupportRow> rows = model::model_support(m, db, f.options());
  std::cout << model::format_support(rows);
  for (const model::SupportRow& r : rows)
    if (!r.ok) return 1;
  return 0;
}

void add_estimate(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("estimate", "prefill and decode latency of a model from the perf database");
  auto f = std::make_shared<ModelFlags>();
  auto json = std::make_shared<std::string>();
  add_model_flags(*cmd, *f);
  cmd->get_option("--model")->required();
  cmd->get_option("--system")->required();
  cmd->add_option("--json", *json, "also write the estimate as JSON to this file");
  auto calibrate = std::make_shared<std::string>();
  auto ceilings = std::make_shared<std::vector<double>>();
  auto* cal = cmd->add_option("--calibrate", *calibrate,
                              "measure the copy and GEMM ceilings of this device (cpu or cuda:N) now and scale the part "
                              "of every answer its bounding ceiling explains by stored / now (Note [ceilings now])");
  cmd->add_option("--ceilings", *ceilings, "the same scaling to given ceilings: GBPS,GFLOPS (copy, GEMM)")
      ->delimiter(',')
      ->expected(2)
      ->excludes(cal);
  cmd->callback([f, json, calibrate, ceilings, &status] {
    model::ModelSpec m = model::load_model(f->model);
    model::EstimateOptions o = f->options();
    model::validate_options(m, o);
    perfdb::Database db = f->load_db();
    if (!ceilings->empty()) {
      if (!((*ceilings)[0] > 0) || !((*ceilings)[1] > 0))
        throw Error(ErrorCode::invalid_argument,
                    fmt::format("estimate: --ceilings expects two positive numbers GBPS,GFLOPS, got {},{}",
                                (*ceilings)[0], (*ceilings)[1]));
      o.now = {(*ceilings)[0], (*ceilings)[1]};
    } else if (!calibrate->empty()) {
      const Device d = parse_device(*calibrate);
      std::cerr << "opforge estimate: measuring the copy and GEMM ceilings of " << d.str() << "\n";
      o.now = perfdb::measure_ceilings(global_registry(), d.kind, d.index, o.dtype);
    }
    model::Estimate e = model::estimate(m, db, o);
    std::cout << model::format_estimate(e);
    if (!json->empty()) {
      model::write_estimate_json(e, *json);
      std::cout << "wrote " << *json << "\n";
    }
    status = 0;
  });
}

}  // namespace opforge::cli
