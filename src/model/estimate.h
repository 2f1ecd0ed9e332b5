// Prefill / decode latency of a whole model from the performance database.
//
//   perfdb::Database db = perfdb::Database::load("h100");
//   Estimate e = estimate(load_model("llama-3.1-8b"), db, {.tp = 2, .batch = 8});
//   std::cout << format_estimate(e);
//
// TTFT = layers x (prefill layer) + head (embedding, final norm, lm_head for the last token of
// each sequence); TPOT = layers x (decode layer) + head at context input_len + output_len / 2 (the
// mean context over the generated tokens); tokens/s = batch / TPOT. Every op is queried with impl
// "auto"; a PerfDataNotAvailable of any query is the estimate's error (no other op's data is used).
//
// Note [ceilings now]: a shared machine changes speed over hours (the 2-core VM's GEMM ceiling
// moved 110-172 GFLOP/s between collections), and stored rows keep the speed of their run. With
// EstimateOptions::now (the ceilings measured when the estimate runs, perfdb::measure_ceilings),
// the part of every answer that its bounding ceiling explains is scaled by stored / now of that
// ceiling. The bound is the larger roofline time at the stored ceilings (its table's header):
// flops / GEMM ceiling, else bytes / copy ceiling; its share of the stored time, s = roofline
// time / stored time (at most 1), gives the factor s * stored / now + (1 - s): a GEMV or a large
// norm near the copy ceiling follows the machine's bandwidth, a small expert GEMM whose time is
// mostly launch latency barely moves. (Scaling whole answers got an H100's Llama decode layers
// right from H200 rows, 0.73 -> 0.94-1.03 of measured, but put Qwen3-30B-A3B's, whose expert
// GEMMs are latency-bound, 1.36-1.69x too high; docs/perf/estimator.md.) Modelled host loops
// scale by the copy ratio of the table their ceiling came from; all_reduce rows (an
// interconnect, not this device) are not scaled. The unscaled figures stay beside them (stored_*).
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "opforge/perfdb.h"

namespace opforge::model {

struct EstimateOptions {
  int64_t tp = 1;
  int64_t batch = 1;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  std::string dtype = "bf16";
  std::string impl = "auto";
  perfdb::Ceilings now;  // > 0: scale the answers to these ceilings (Note [ceilings now])
};

struct EstimateRow {
  OpCall call;
  perfdb::Answer answer;  // per call
  double total_us = 0;    // answer.us * scale * call.count
  double share = 0;       // of its block (layer or head)
  double scale = 1;       // Note [ceilings now]: stored ceiling / the one measured now
  std::string scale_how;  // which ceiling and its two values; empty when not scaled
  double stored_total_us = 0;  // answer.us * call.count
};

struct PhaseEstimate {
  Workload workload;
  std::vector<EstimateRow> layer;
  double layer_us = 0;
  std::vector<EstimateRow> head;
  double head_us = 0;
  double total_us = 0;  // layers * layer_us + head_us
  double layer_stored_us = 0, head_stored_us = 0, total_stored_us = 0;  // unscaled (Note [ceilings now])
};

struct Estimate {
  ModelSpec model;
  std::string system;
  EstimateOptions options;
  PhaseEstimate prefill, decode;
  double ttft_us = 0, tpot_us = 0, tokens_per_s = 0;
  double ttft_stored_us = 0, tpot_stored_us = 0;  // unscaled (Note [ceilings now])
};

// Note [ring all-reduce model]: t = 2(tp-1)/tp * bytes / bus_gbps + 2(tp-1) * step_latency_us.
struct RingModel {
  double bus_gbps = 0;
  double step_latency_us = 0;
  std::string source;  // where the constants come from
};
RingModel ring_model(const perfdb::Database& db);
double ring_all_reduce_us(const RingModel& r, double bytes, int64_t tp);

// One call's answer: a database query, the ring model for an all_reduce the database has no
// data for at that tp, or bytes / copy ceiling for a modelled call. Throws PerfDataNotAvailable.
perfdb::Answer answer_call(const perfdb::Database& db, const OpCall& call, const std::string& impl,
                           const std::string& dtype);
std::vector<EstimateRow> estimate_calls(const perfdb::Database& db, const std::vector<OpCall>& calls,
                                        const std::string& impl, const std::string& dtype,
                                        const perfdb::Ceilings& now = {});
// The factor of Note [ceilings now] for one call whose stored answer is `stored_us` (1 when `now`
// is all 0); `how` says which ceiling and how much of the time it explains.
double ceiling_scale(const perfdb::Database& db, const OpCall& call, const std::string& dtype,
                     const perfdb::Ceilings& now, double stored_us, std::string* how = nullptr);

PhaseEstimate estimate_phase(const ModelSpec& m, const perfdb::Database& db, const Workload& w,
                             const std::string& impl = "auto", const perfdb::Ceilings& now = {});
Estimate estimate(const ModelSpec& m, const perfdb::Database& db, const EstimateOptions& o);
// Lengths, batch, dtype and tp against the model (Error naming the flag); estimate() runs it too.
void validate_options(const ModelSpec& m, const EstimateOptions& o);

std::string format_rows(const std::vector<EstimateRow>& rows);  // the per-op table
std::string format_estimate(const Estimate& e);
std::string estimate_json(const Estimate& e);  // the same content as JSON text
void write_estimate_json(const Estimate& e, const std::string& path);

// `opforge support --model M --system S`: every call of the prefill and decode layer and head and
// whether the database answers it.
struct SupportRow {
  Phase phase = Phase::prefill;
  std::string block;  // "layer" or "head"
  OpCall call;
  bool ok = false;
  std::string status;  // measured / interpolated / extrapolated / modelled / missing
  std::string detail;  // the answer's how, or the PerfDataNotAvailable message
};
std::vector<SupportRow> model_support(const ModelSpec& m, const perfdb::Database& db, const EstimateOptions& o);
std::string format_support(const std::vector<SupportRow>& rows);

}  // namespace opforge::model
