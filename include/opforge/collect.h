// The collector: model-shaped grids per op and device, and `opforge collect`, which times every
// kernel over a grid and writes data/perf/<system>/<op>.csv (format in opforge/perfdb.h).
//
// Note [collection grids]: the points come from the model families the estimator ships
// (Llama-3.1-8B / 70B, Qwen3-8B, Qwen3-30B-A3B, Mixtral-8x7B) at tensor-parallel degrees 1, 2, 4
// and 8 (per-GPU shapes: heads / tp, kv heads / tp but at least 1, intermediate / tp, vocab / tp
// rounded up). Tokens run over 1 .. 32768: the `full` grid takes powers of two and their
// midpoints (3, 6, 12, ...), `quick` fewer points (see grids.cpp). The expert GEMMs of MoE models
// also get the expected tokens per expert, ceil(tokens * k / experts). A point is skipped when
// its roofline time, max(bytes / copy ceiling, flops / GEMM ceiling), is above GridCap::max_seconds
// or its tensors above GridCap::max_bytes (the CPU grids; docs/design.md "Collector and grids").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "opforge/device.h"
#include "opforge/harness.h"
#include "opforge/perfdb.h"

namespace opforge::perfdb {

struct GridCap {
  double copy_gbps = 0;     // ceilings the roofline time is computed with (0: that term is 0)
  double gemm_gflops = 0;
  double max_seconds = 0;   // roofline seconds per call above which a point is dropped (0: none)
  double max_bytes = 0;     // bytes of all its tensors above which a point is dropped (0: none)
  // Points whose `tokens` is one of these are kept up to keep_max_seconds instead (the CPU: the
  // prefill lengths the estimator is validated at, 128 and 512).
  std::vector<int64_t> keep_tokens;
  double keep_max_seconds = 0;
  // Restrictions of the grid (empty: all): model-shaped points of these models only (names as
  // the grid spells them, e.g. "Llama-3.1-8B"; an unknown name is an Error listing them), and
  // these TP degrees only.
  std::vector<std::string> only_models;
  std::vector<int64_t> only_tp;
  // Points whose dim NAME lies outside [lo, hi] are dropped (a denser grid over part of a range,
  // e.g. tokens 1 .. 4096); points of ops without that dim are kept.
  std::map<std::string, std::pair<int64_t, int64_t>> only_ranges;
};
// The caps `opforge collect` uses on a device: CPU 2 s of roofline time (10 s at tokens 128 and
// 512) and 1.5 GiB of tensors;
// CUDA 8 GiB of tensors (the harness holds every input as f64 on the host too) and no time cap.
GridCap default_cap(DeviceKind device, double copy_gbps, double gemm_gflops);

// The points of `op` on grid `grid` ("quick" or "full") for `device`, sorted by the dims in column
// order, duplicates removed, capped. Error naming the grid when it is neither.
std::vector<Dims> grid_points(const std::string& op, const std::string& grid, DeviceKind device,
                              const GridCap& cap = {}, const std::string& dtype = "bf16");
// Bytes of every tensor of case_at(op, dims) in `dtype` (index tensors in their own dtype).
double footprint_bytes(const std::string& op, const std::string& dtype, const Dims& dims);

struct CollectOptions {
  std::string system;                // required: data/perf/<system>/
  std::string grid = "quick";        // quick | full
  std::vector<std::string> models;   // only these models' shapes (GridCap::only_models)
  std::vector<int64_t> tp;           // only these TP degrees (GridCap::only_tp)
  // only points with each named dim in [lo, hi] (GridCap::only_ranges); a name that is no dim of
  // any op collected is an Error.
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;
  std::string dtype = "bf16";
  std::string root;                  // the folder holding <system>/ (default: $OPFORGE_PERF_DATA, else data/perf)
  std::vector<std::string> impls;    // empty: every available non-reference kernel of the device
  std::vector<std::string> ops;      // empty: every known op
  // Replaces the grid of the ops named here (tests and hand-picked points); not capped.
  std::map<std::string, std::vector<Dims>> points;
  bool progress = true;              // one updating line on stderr
  bool dry_run = false;
  // Measure the selected points again although the files hold them: their rows are dropped from
  // the files before the run and written anew, the other rows stay; the header gains a
  // "recollected" line (what, when, at which commit and ceilings). After an interruption, resume
  // without it.
  bool replace = false;
  double copy_gbps = 0;              // > 0: use as the copy ceiling instead of measuring it
  double gemm_gflops = 0;            // > 0: use as the GEMM ceiling instead of measuring it              // measure the ceilings, list what would run, write nothing
  harness::Options harness;          // sample bounds of the perf timing
  // Timed samples per point; 0: the device's default (Note [samples on a shared CPU] in
  // src/perfdb/collect.cpp: kCpuSamples on the CPU, harness.perf_min_samples on a GPU).
  int samples = 0;
  // Passes over each line of the grid (Note [passes over a line] in src/perfdb/collect.cpp), each
  // with 1 / passes of a point's time cap; 0: the device's default (3 on the CPU, 1 on a GPU).
  int passes = 0;
  // Where notices go (default: stderr, one line each).
  std::function<void(const std::string&)> notice;
};

struct CollectSummary {
  int measured = 0;         // rows written by this run
  int already_present = 0;  // rows found in the files (resumed)
  int capped = 0;           // grid points dropped by the cap
  int not_applicable = 0;   // kernel predicate said no, or the measurement failed (noticed)
  double seconds = 0;
  double ceiling_gbps = 0, ceiling_gflops = 0;
  // Note [ceiling drift]: the GEMM ceiling measured again after the rows (0 when nothing was
  // measured or there is no linear kernel). A shared machine can change speed during a long
  // collection; a difference above 10% is noticed, and such a database should be collected again.
  double ceiling_gflops_end = 0;
  std::string device_name;
  std::vector<std::string> files;
};
// Runs the collection; throws Error for a header mismatch with an existing file (naming it).
CollectSummary collect(const Registry& reg, const CollectOptions& opt);

// The copy and GEMM ceilings of `device` measured now, the way `collect` measures those it
// writes into its headers (Note [collection ceilings] in src/perfdb/collect.cpp); gemm_gflops is
// 0 when the device has no linear kernel or it failed. A few seconds on the CPU.
Ceilings measure_ceilings(const Registry& reg, DeviceKind device, int device_index = 0,
                          const std::string& dtype = "bf16");

// opforge's git commit (`git rev-parse --short HEAD`), "unknown" outside a checkout.
std::string git_commit();

// The CPU's model name from /proc/cpuinfo plus the thread count, e.g.
// "AMD EPYC 7B12 (2 threads)"; "unknown CPU (2 threads)" when it cannot be read.
std::string cpu_device_name();

}  // namespace opforge::perfdb
