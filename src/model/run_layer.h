// One decoder layer built from opforge ops with random weights, run and timed: the measurement
// the estimator's per-layer prediction is validated against (`opforge run-layer`).
//
// The layer runs the same calls as decoder_layer() (model.h) in the same order, each through the
// registry with the given policy on the given device. Steps that are not opforge ops run as host
// loops and are timed as their own rows, with the same names the estimator gives its modelled
// rows: qkv_split (the fused qkv output copied into contiguous q, k, v), moe_gather (token rows
// grouped by expert, from the real routing of topk_softmax on random router logits) and
// moe_combine (the weighted sum of each token's k expert rows). Each expert's GEMMs run at the
// number of rows routed to it. All-reduces are not run (one device): a tp > 1 layer has per-GPU
// shapes and no all_reduce rows.
#pragma once

#include <string>
#include <vector>

#include "model/estimate.h"
#include "model/model.h"
#include "opforge/policy.h"

namespace opforge::model {

struct RunLayerOptions {
  Workload workload;
  std::string device = "cpu";
  int repeat = 5;  // timed repetitions (median); one untimed warm-up runs first
  int warmup = 1;
  // Passes of `repeat` repetitions, the fastest kept (Note [layer passes] in run_layer.cpp);
  // 0: 3 on the CPU, 1 on a GPU (where the layer is timed again as a graph).
  int passes = 0;
  // GPU: layers per CUDA graph in the whole-layer timing (Note [layer timing] in run_layer.cpp);
  // 20, as the collector's graphs of 20 calls, so both time the device in the same sustained state.
  int graph_layers = 20;
  Policy policy;   // default: optimized kernels on
};

struct MeasuredRow {
  std::string name;    // as in decoder_layer(): "qkv_proj", "moe_combine", ...
  std::string op;      // the op that ran, empty for a host loop
  std::string kernel;  // the impl that ran, or "host loop"
  std::string shapes;
  int64_t calls = 0;   // per layer (experts: the ones that got tokens)
  double us = 0;       // median over the repetitions of the row's time in one layer
};

struct LayerRun {
  Workload workload;
  std::string device;
  std::vector<MeasuredRow> rows;
  double layer_us = 0;  // median over the repetitions (of the fastest pass) of the whole layer
  int repeat = 0;
  int passes = 0;        // passes of the repetitions, the fastest kept
  int graph_layers = 0;  // layers per replayed graph (0: not timed as a graph)
  // How layer_us was timed (Note [layer timing] in run_layer.cpp): "host clock, sum of steps" on
  // the CPU; "device graph" or "device events" on a GPU.
  std::string layer_timing;
  bool host_staged = false;  // some step ran as a host loop with copies to and from the device
  // The ceilings measured around the run (`run-layer --calibrate`: the mean of before and after)
  // that the prediction was scaled to (Note [ceilings now] in model/estimate.h); 0: not scaled.
  perfdb::Ceilings ceilings_now;
};

LayerRun run_layer(const ModelSpec& m, const RunLayerOptions& o);

// The measured rows next to the estimator's rows of the same names (all_reduce rows left out),
// with predicted / measured per row and for the layer.
std::string format_run(const ModelSpec& m, const LayerRun& run, const std::vector<EstimateRow>* predicted,
                       const std::string& system);
std::string run_json(const ModelSpec& m, const LayerRun& run, const std::vector<EstimateRow>* predicted,
                     const std::string& system);

}  // namespace opforge::model
