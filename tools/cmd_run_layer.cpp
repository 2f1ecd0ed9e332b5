// opforge run-layer --model M (--tokens N | --batch B --context C) [--device cpu|cuda]
//                   [--dtype bf16] [--repeat R] [--passes P] [--graph-layers L] [--tp N] [--system S [--root DIR] [--calibrate]]
//                   [--json F]
//
// Builds one decoder layer of the model from opforge ops with random weights, runs it through the
// registry's kernels (policy: --ops / --config / OPFORGE_OPS, default all optimized kernels) and
// prints the measured time per op and for the layer; with --system, the estimator's prediction
// for the same layer from that perf database next to it.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "model/run_layer.h"
#include "opforge/collect.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "opforge/perfdb.h"
#include "tools/cli.h"

namespace opforge::cli {

namespace {

struct RunLayerFlags {
  Common common;
  std::string model, system, root, json;
  int64_t tokens = 0, batch = 0, context = 0, tp = 1;
  std::string device = "cpu", dtype = "bf16", impl = "auto";
  int repeat = 5;
  int graph_layers = 20;
  int passes = 0;
  bool calibrate = false;
};

model::Workload workload_of(const RunLayerFlags& f) {
  const bool prefill = f.tokens != 0, decode = f.context != 0;
  if (prefill == decode)
    throw Error(ErrorCode::invalid_argument,
                "run-layer: give either --tokens N (prefill) or --batch B --context C (decode)");
  if (f.tokens < 0 || f.context < 0 || f.batch < 0)
    throw Error(ErrorCode::invalid_argument, "run-layer: --tokens, --batch and --context must be positive");
  model::Workload w = prefill ? model::Workload::prefill(f.batch ? f.batch : 1, f.tokens, f.tp)
                              : model::Workload::decode(f.batch ? f.batch : 1, f.context, f.tp);
  w.dtype = f.dtype;
  return w;
}

void run(const RunLayerFlags& f) {
  model::ModelSpec m = model::load_model(f.model);
  model::RunLayerOptions o;
  o.workload = workload_of(f);
  o.device = f.device;
  o.repeat = f.repeat;
  o.graph_layers = f.graph_layers;
  o.passes = f.passes;
  o.policy = f.common.policy();
  model::validate_workload(m, o.workload);
  std::vector<model::EstimateRow> predicted;
  std::optional<perfdb::Database> db;
  if (f.calibrate && f.system.empty())
    throw Error(ErrorCode::invalid_argument, "run-layer: --calibrate scales a prediction; give --system too");
  if (!f.system.empty()) {  // before the run: a missing op fails fast
    db = perfdb::Database::load(f.system, f.root);
    predicted = model::estimate_calls(*db, model::decoder_layer(m, o.workload, /*windows=*/false), f.impl, o.workload.dtype);
  }
  const Device dev = parse_device(o.device);
  auto ceilings = [&] {
    std::cerr << "opforge run-layer: measuring the copy and GEMM ceilings of " << dev.str() << "\n";
    return perfdb::measure_ceilings(global_registry(), dev.kind, dev.index, o.workload.dtype);
  };
  perfdb::Ceilings before;
  if (f.calibrate) before = ceilings();
  model::LayerRun r = model::run_layer(m, o);
  if (f.calibrate) {  // Note [ceilings now]: the mean of the ceilings just before and just after the run
    const perfdb::Ceilings after = ceilings();
    r.ceilings_now = {0.5 * (before.copy_gbps + after.copy_gbps), 0.5 * (before.gemm_gflops + after.gemm_gflops)};
    predicted = model::estimate_calls(*db, model::decoder_layer(m, o.workload, /*windows=*/false), f.impl, o.workload.dtype,
                                      r.ceilings_now);
  }
  const auto* p = f.system.empty() ? nullptr : &predicted;
  std::cout << model::format_run(m, r, p, f.system);
  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << model::run_json(m, r, p, f.system) << "\n";
    if (!out) throw Error(ErrorCode::io, "cannot write " + f.json);
    std::cout << "wrote " << f.json << "\n";
  }
}

}  // namespace

void add_run_layer(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("run-layer", "run one decoder layer of a model from opforge ops and time it");
  auto f = std::make_shared<RunLayerFlags>();
  add_common(*cmd, f->common);
  cmd->add_option("--model", f->model, "a shipped model or a path to a config.json")->required();
  cmd->add_option("--tokens", f->tokens, "prefill: tokens per sequence (with --batch sequences, default 1)");
  cmd->add_option("--batch", f->batch, "sequences (decode: one new token each)");
  cmd->add_option("--context", f->context, "decode: context length of every sequence");
  cmd->add_option("--tp", f->tp, "tensor-parallel degree: per-GPU shapes (all-reduces are not run)");
  cmd->add_option("--device", f->device, "cpu or cuda:N");
  cmd->add_option("--dtype", f->dtype, "bf16, f16 or f32");
  cmd->add_option("--repeat", f->repeat, "timed repetitions (the median is reported)");
  cmd->add_option("--passes", f->passes,
                  "passes of --repeat repetitions, the fastest kept (default: 3 on the CPU, as the collector; 1 on a GPU)");
  cmd->add_option("--graph-layers", f->graph_layers,
                  "GPU: layers per CUDA graph of the whole-layer timing, replayed --repeat times (default 20, "
                  "as the collector's graphs of 20 calls; Note [layer timing])");
  cmd->add_option("--system", f->system, "also print the estimator's prediction from this perf database");
  cmd->add_option("--impl", f->impl, "impl the prediction is queried for (auto: the fastest stored)");
  cmd->add_option("--root", f->root, "perf data folder (default: $OPFORGE_PERF_DATA, else data/perf)");
  cmd->add_option("--json", f->json, "also write the result as JSON");
  cmd->add_flag("--calibrate", f->calibrate,
                "scale the prediction to the copy and GEMM ceilings measured just before and after the run "
                "(Note [ceilings now]); the unscaled prediction is printed too");
  cmd->callback([f, &status] {
    run(*f);
    status = 0;
  });
}

}  // namespace opforge::cli
