// The estimator: op calls of a model (layer.cpp) -> database answers -> per-layer and end-to-end
// latency (docs/design.md, "Estimator").
#include "model/estimate.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "opforge/error.h"

namespace opforge::model {

using perfdb::Answer;
using perfdb::Method;
using perfdb::PerfDataNotAvailable;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// The copy bandwidth measured with the database's tables (every file records the one of its run).
// Row-wise memory-bound ops first (their runs measure the copy ceiling of the device they time),
// all_reduce last (its file may come from another machine size).
double copy_ceiling_gbps(const perfdb::Database& db, std::string* from = nullptr) {
  std::vector<std::string> order = {"rms_norm", "fused_add_rms_norm", "silu_and_mul", "embedding"};
  for (const std::string& op : db.ops())
    if (op != "all_reduce" && std::find(order.begin(), order.end(), op) == order.end()) order.push_back(op);
  order.push_back("all_reduce");
  for (const std::string& op : order) {
    if (!db.has_op(op)) continue;
    const perfdb::OpTable& t = db.table(op);
    if (t.header.ceiling_gbps > 0) {
      if (from) *from = op;
      return t.header.ceiling_gbps;
    }
  }
  throw PerfDataNotAvailable("system '" + db.system() +
                             "': no table records a copy ceiling (ceiling_gbps), needed for the modelled rows");
}

bool all_reduce_measured_at(const perfdb::Database& db, int64_t tp) {
  if (!db.has_op("all_reduce")) return false;
  for (const perfdb::Row& r : db.table("all_reduce").rows)
    if (auto it = r.dims.find("tp"); it != r.dims.end() && it->second == tp) return true;
  return false;
}

// The smallest message_bytes of the all_reduce rows at `tp` (0: none).
int64_t smallest_all_reduce_message(const perfdb::Database& db, int64_t tp) {
  int64_t smallest = 0;
  if (!db.has_op("all_reduce")) return 0;
  for (const perfdb::Row& r : db.table("all_reduce").rows) {
    auto t = r.dims.find("tp"), b = r.dims.find("message_bytes");
    if (t == r.dims.end() || b == r.dims.end() || t->second != tp) continue;
    if (smallest == 0 || b->second < smallest) smallest = b->second;
  }
  return smallest;
}

void finish_shares(std::vector<EstimateRow>& rows, double total) {
  for (EstimateRow& r : rows) r.share = total > 0 ? r.total_us / total : 0;
}

double sum_us(const std::vector<EstimateRow>& rows) {
  double s = 0;
  for (const EstimateRow& r : rows) s += r.total_us;
  return s;
}

double stored_us(const std::vector<EstimateRow>& rows) {
  double s = 0;
  for (const EstimateRow& r : rows) s += r.stored_total_us;
  return s;
}

}  // namespace

// Note [ring all-reduce model]: a ring all-reduce moves 2(tp-1)/tp of the buffer through each
// link (reduce-scatter + all-gather) in 2(tp-1) steps: t = 2(tp-1)/tp * bytes / bus_gbps +
// 2(tp-1) * step_latency. Used for every tp the database has no all_reduce rows for; its answers
// are marked "modelled". The constants:
//   - calibrated, when the database has all_reduce rows at some other tp: at the largest measured
//     tp, the step latency from its smallest message (t / 2(tp-1)) and the bus bandwidth from its
//     largest (2(tp-1)/tp * bytes / (t - 2(tp-1) * latency));
//   - else by the system's name: NVLink 4 (H100, H200 SXM): 360 GB/s (what NCCL reaches of the
//     450 GB/s per direction), 1.5 us per step; NVLink 3 (A100): 230 GB/s, 2 us;
//   - else (a CPU machine, ranks sharing host memory): the database's copy ceiling, 1 us per step.
RingModel ring_model(const perfdb::Database& db) {
  if (db.has_op("all_reduce")) {
    const perfdb::Row *small = nullptr, *large = nullptr;
    int64_t tp = 0;
    for (const perfdb::Row& r : db.table("all_reduce").rows) tp = std::max(tp, r.dims.count("tp") ? r.dims.at("tp") : 0);
    for (const perfdb::Row& r : db.table("all_reduce").rows) {
      if (!r.dims.count("tp") || r.dims.at("tp") != tp || !r.dims.count("message_bytes") || r.median_us <= 0) continue;
      if (!small || r.dims.at("message_bytes") < small->dims.at("message_bytes")) small = &r;
      if (!large || r.dims.at("message_bytes") > large->dims.at("message_bytes")) large = &r;
    }
    if (tp > 1 && small && large && large != small) {
      const double steps = 2.0 * double(tp - 1), share = steps / double(tp);
      const double latency = small->median_us / steps;
      const double wire_us = large->median_us - steps * latency;
      if (wire_us > 0) {
        const double gbps = share * double(large->dims.at("message_bytes")) / wire_us / 1e3;
        return {gbps, latency,
                fmt::format("calibrated on the measured all_reduce at tp={} ({} and {} bytes)", tp,
                            small->dims.at("message_bytes"), large->dims.at("message_bytes"))};
      }
    }
  }
  const std::string name = lower(db.system());
  if (name.find("h100") != std::string::npos || name.find("h200") != std::string::npos)
    return {360.0, 1.5, "NVLink 4 constants (system name names an H100/H200)"};
  if (name.find("a100") != std::string::npos) return {230.0, 2.0, "NVLink 3 constants (system name names an A100)"};
  std::string op;
  double gbps = copy_ceiling_gbps(db, &op);
  return {gbps, 1.0, "shared-memory ranks at the copy ceiling of the " + op + " table"};
}

double ring_all_reduce_us(const RingModel& r, double bytes, int64_t tp) {
  if (tp <= 1) return 0;
  const double t = double(tp);
  return 2.0 * (t - 1.0) / t * bytes / (r.bus_gbps * 1e3) + 2.0 * (t - 1.0) * r.step_latency_us;
}

namespace {

// Note [moe row spread] (layer.cpp): the expected time of the call's experts, sum over its row
// counts of experts x time at those rows, given per call of its `count` (so that count x us is
// that sum). Each row count is one query; the method is the least exact of theirs.
Answer answer_spread(const perfdb::Database& db, const OpCall& c, const std::string& impl, const std::string& dtype) {
  Answer a;
  double total = 0, energy = 0, experts = 0;
  bool has_energy = true;
  std::set<std::string> impls;
  for (const RowsShare& s : c.spread) {
    perfdb::Dims dims = c.dims;
    dims["tokens"] = s.rows;
    Answer one;
    try {
      one = db.query(c.op, impl, dtype, dims);
    } catch (const PerfDataNotAvailable& e) {
      throw PerfDataNotAvailable(fmt::format("at {} rows of the spread (Note [moe row spread]): {}", s.rows, e.what()));
    }
    total += s.experts * one.us;
    experts += s.experts;
    if (one.energy_uj) energy += s.experts * *one.energy_uj;
    else has_energy = false;
    a.method = std::max(a.method, one.method);
    impls.insert(one.impl);
  }
  const double calls = double(std::max<int64_t>(1, c.count));
  a.us = total / calls;
  if (has_energy) a.energy_uj = energy / calls;
  for (const std::string& i : impls) a.impl += (a.impl.empty() ? "" : "+") + i;
  a.how = c.spread.size() == 1
              ? fmt::format("{:.1f} experts at {} rows, {}", experts, c.spread.front().rows, perfdb::method_name(a.method))
              : fmt::format("{:.1f} experts over {} row counts {}..{} (binomial, Note [moe row spread]), {}", experts,
                            c.spread.size(), c.spread.front().rows, c.spread.back().rows,
                            perfdb::method_name(a.method));
  return a;
}

}  // namespace

Answer answer_call(const perfdb::Database& db, const OpCall& c, const std::string& impl, const std::string& dtype) {
  if (c.modelled_bytes > 0) {
    std::string op;
    const double gbps = copy_ceiling_gbps(db, &op);
    Answer a;
    a.us = c.modelled_bytes / (gbps * 1e3);
    a.method = Method::modelled;
    a.impl = "host loop";
    a.how = fmt::format("{:.0f} bytes at the copy ceiling {:.1f} GB/s ({} table)", c.modelled_bytes, gbps, op);
    return a;
  }
  if (c.op == "all_reduce" && !all_reduce_measured_at(db, c.dims.at("tp"))) {
    const RingModel r = ring_model(db);
    const int64_t tp = c.dims.at("tp");
    Answer a;
    a.us = ring_all_reduce_us(r, double(c.dims.at("message_bytes")), tp);
    a.method = Method::modelled;
    a.impl = "ring";
    a.how = fmt::format("ring model, {:.0f} GB/s, {:.1f} us/step, {} steps: {}; no all_reduce measured at tp={}",
                        r.bus_gbps, r.step_latency_us, 2 * (tp - 1), r.source, tp);
    return a;
  }
  if (c.op == "all_reduce") {
    // Note [ring all-reduce model]: below the smallest measured message the step latencies are
    // the time (the wire term of 4 KiB at NVLink speed is 0.01 us), and all_reduce has no cost
    // model to extrapolate with, so the smallest message's time answers. Small hidden sizes at
    // small batches land there (Qwen3-0.6B's decode at batch 1: 2 KiB).
    const int64_t bytes = c.dims.at("message_bytes"), smallest = smallest_all_reduce_message(db, c.dims.at("tp"));
    if (bytes < smallest) {
      perfdb::Dims at = c.dims;
      at["message_bytes"] = smallest;
      Answer a = db.query(c.op, impl, dtype, at);
      a.method = std::max(a.method, Method::extrapolated);
      a.how = fmt::format("{} bytes, below the smallest measured message: its time at {} bytes, the step "
                          "latencies (Note [ring all-reduce model]); {}",
                          bytes, smallest, a.how);
      return a;
    }
  }
  Answer a = !c.spread.empty() ? answer_spread(db, c, impl, dtype) : db.query(c.op, impl, dtype, c.dims);
  if (c.work_scale != 1.0) {  // Note [sliding-window layers] (layer.cpp)
    a.us *= c.work_scale;
    if (a.energy_uj) *a.energy_uj *= c.work_scale;
    a.how += fmt::format("; x{:.3f} for the sliding window's share of the causal work", c.work_scale);
    a.method = std::max(a.method, Method::extrapolated);
  }
  return a;
}

double ceiling_scale(const perfdb::Database& db, const OpCall& c, const std::string& dtype,
                     const perfdb::Ceilings& now, double stored_us, std::string* how) {
  if (how) how->clear();
  if (!(now.copy_gbps > 0) && !(now.gemm_gflops > 0)) return 1.0;
  // The share of the stored time the bounding ceiling explains scales by stored / now; the rest
  // (launch latency, a kernel below its roofline) stays.
  auto scale = [&](const char* name, double stored, double measured, const char* unit, double roof_us) {
    if (!(stored > 0) || !(measured > 0) || !(stored_us > 0)) return 1.0;
    const double share = std::min(1.0, roof_us / stored_us);
    const double f = share * (stored / measured) + (1.0 - share);
    if (how)
      *how = fmt::format("x{:.3f}: {:.0f}% of it at the {} ceiling, {:.1f} -> {:.1f} {}", f, 100.0 * share, name,
                         stored, measured, unit);
    return f;
  };
  if (c.modelled_bytes > 0) {
    const double gbps = copy_ceiling_gbps(db);
    return scale("copy", gbps, now.copy_gbps, "GB/s", c.modelled_bytes / (gbps * 1e3));
  }
  if (c.op == "all_reduce" || !db.has_op(c.op)) return 1.0;
  const perfdb::FileHeader& h = db.table(c.op).header;
  const Cost cost = perfdb::cost_at(c.op, dtype, c.dims);
  const double t_bytes = h.ceiling_gbps > 0 ? cost.bytes / (h.ceiling_gbps * 1e3) : 0;  // us
  const double t_flops = h.ceiling_gflops > 0 ? cost.flops / (h.ceiling_gflops * 1e3) : 0;
  if (t_flops > t_bytes) return scale("GEMM", h.ceiling_gflops, now.gemm_gflops, "GFLOP/s", t_flops);
  return scale("copy", h.ceiling_gbps, now.copy_gbps, "GB/s", t_bytes);
}

std::vector<EstimateRow> estimate_calls(const perfdb::Database& db, const std::vector<OpCall>& calls,
                                        const std::string& impl, const std::string& dtype,
                                        const perfdb::Ceilings& now) {
  std::vector<EstimateRow> rows;
  for (const OpCall& c : calls) {
    EstimateRow r;
    r.call = c;
    try {
      r.answer = answer_call(db, c, impl, dtype);
    } catch (const PerfDataNotAvailable& e) {
      throw PerfDataNotAvailable(c.name + " (" + c.op + " " + dims_str(c.dims, c.op) + "): " + e.what());
    }
    r.scale = ceiling_scale(db, c, dtype, now, r.answer.us, &r.scale_how);
    r.stored_total_us = r.answer.us * double(c.count) * c.layer_share;
    r.total_us = r.stored_total_us * r.scale;
    rows.push_back(std::move(r));
  }
  finish_shares(rows, sum_us(rows));
  return rows;
}

PhaseEstimate estimate_phase(const ModelSpec& m, const perfdb::Database& db, const Workload& w, const std::string& impl,
                             const perfdb::Ceilings& now) {
  PhaseEstimate p;
  p.workload = w;
  p.layer = estimate_calls(db, decoder_layer(m, w), impl, w.dtype, now);
  p.layer_us = sum_us(p.layer);
  p.head = estimate_calls(db, model_head(m, w), impl, w.dtype, now);
  p.head_us = sum_us(p.head);
  p.total_us = double(m.layers) * p.layer_us + p.head_us;
  p.layer_stored_us = stored_us(p.layer);
  p.head_stored_us = stored_us(p.head);
  p.total_stored_us = double(m.layers) * p.layer_stored_us + p.head_stored_us;
  return p;
}

namespace {

Workload prefill_of(const EstimateOptions& o) {
  Workload w = Workload::prefill(o.batch, o.input_len, o.tp);
  w.dtype = o.dtype;
  return w;
}

// The decode step at the mean context over the generated tokens: input_len + output_len / 2.
Workload decode_of(const EstimateOptions& o) {
  Workload w = Workload::decode(o.batch, o.input_len + o.output_len / 2, o.tp);
  w.dtype = o.dtype;
  return w;
}

}  // namespace

void validate_options(const ModelSpec& m, const EstimateOptions& o) {
  if (o.input_len < 1)
    throw Error(ErrorCode::invalid_argument, "--input-len: expected at least 1 token, got " + std::to_string(o.input_len));
  if (o.output_len < 0)
    throw Error(ErrorCode::invalid_argument, "--output-len: expected 0 or more tokens, got " + std::to_string(o.output_len));
  validate_workload(m, prefill_of(o));
  if (o.output_len / 2 > 2147483647 - o.input_len)  // Note [size limits] (layer.cpp)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("--input-len {} + --output-len {} / 2: the decode context is past the 2^31 - 1 positions "
                            "attention's int32 offsets hold (Note [size limits])",
                            o.input_len, o.output_len));
  validate_workload(m, decode_of(o));
}

Estimate estimate(const ModelSpec& m, const perfdb::Database& db, const EstimateOptions& o) {
  validate_options(m, o);
  Estimate e;
  e.model = m;
  e.system = db.system();
  e.options = o;
  e.prefill = estimate_phase(m, db, prefill_of(o), o.impl, o.now);
  e.decode = estimate_phase(m, db, decode_of(o), o.impl, o.now);
  e.ttft_us = e.prefill.total_us;
  e.tpot_us = e.decode.total_us;
  e.ttft_stored_us = e.prefill.total_stored_us;
  e.tpot_stored_us = e.decode.total_stored_us;
  e.tokens_per_s = e.tpot_us > 0 ? double(o.batch) / (e.tpot_us * 1e-6) : 0;
  return e;
}

// ---- text and JSON ---------------------------------------------------------------------------

std::string format_rows(const std::vector<EstimateRow>& rows) {
  std::string s = fmt::format("  {:<16} {:<10} {:<26} {:<56} {:>5} {:>11} {:>11} {:>6}  {}\n", "op", "kernel", "op name",
                              "shapes", "calls", "us/call", "us", "share", "how");
  for (const EstimateRow& r : rows) {
    const std::string method = perfdb::method_name(r.answer.method);
    // Answer::how often starts with the method's own name ("interpolated in tokens ..."): say it once.
    const std::string how = (r.answer.how.rfind(method, 0) == 0 ? r.answer.how
                             : r.answer.how.empty()             ? method
                                                                : method + ": " + r.answer.how) +
                            (r.call.note.empty() ? "" : " [" + r.call.note + "]") +
                            (r.scale_how.empty() ? "" : " (" + r.scale_how + ")");
    // calls per layer: a count, or its mean over the layers where only some make the call
    const std::string calls = r.call.layer_share == 1.0 ? std::to_string(r.call.count)
                                                         : fmt::format("{:.2f}", double(r.call.count) * r.call.layer_share);
    s += fmt::format("  {:<16} {:<10} {:<26} {:<56} {:>5} {:>11.2f} {:>11.2f} {:>5.1f}%  {}\n", r.call.name,
                     r.answer.impl, r.call.op.empty() ? "(modelled)" : r.call.op, dims_str(r.call.dims, r.call.op),
                     calls, r.answer.us * r.scale, r.total_us, 100.0 * r.share, how);
  }
  return s;
}

namespace {

std::string workload_str(const Workload& w) {
  if (w.phase == Phase::prefill)
    return fmt::format("prefill: {} sequence(s) x {} tokens = {} tokens, tp {}, {}", w.batch, w.tokens,
                       w.total_tokens(), w.tp, w.dtype);
  return fmt::format("decode step: {} sequence(s) at context {}, tp {}, {}", w.batch, w.context, w.tp, w.dtype);
}

std::string format_phase(const ModelSpec& m, const PhaseEstimate& p, bool is_scaled) {
  auto stored = [&](double us, double scale) {
    return is_scaled ? fmt::format(" (stored rows: {:.3f})", us / scale) : std::string();
  };
  std::string s = workload_str(p.workload) + "\n";
  s += m.window_layers > 0 && m.sliding_window > 0
           ? fmt::format(" one decoder layer (the mean of {} layers, {} with a {}-position sliding window):\n", m.layers,
                         std::min(m.window_layers, m.layers), m.sliding_window)
           : std::string(" one decoder layer:\n");
  s += format_rows(p.layer);
  s += fmt::format("  layer total: {:.2f} us x {} layers = {:.3f} ms{}\n", p.layer_us, m.layers,
                   p.layer_us * double(m.layers) / 1e3, stored(p.layer_stored_us * double(m.layers), 1e3));
  s += " once per forward:\n" + format_rows(p.head);
  s += fmt::format("  head total: {:.2f} us{}\n", p.head_us, stored(p.head_stored_us, 1.0));
  s += fmt::format(" {} total: {:.3f} ms{}\n\n", phase_name(p.workload.phase), p.total_us / 1e3,
                   stored(p.total_stored_us, 1e3));
  return s;
}

nlohmann::json rows_json(const std::vector<EstimateRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const EstimateRow& r : rows) {
    nlohmann::json dims = nlohmann::json::object();
    for (const auto& [k, v] : r.call.dims) dims[k] = v;
    nlohmann::json j{{"name", r.call.name},   {"op", r.call.op},          {"kernel", r.answer.impl},
                     {"dims", dims},          {"shapes", dims_str(r.call.dims, r.call.op)},
                     {"calls", r.call.count}, {"us_per_call", r.answer.us}, {"us", r.total_us},
                     {"share", r.share},      {"method", perfdb::method_name(r.answer.method)},
                     {"how", r.answer.how},   {"note", r.call.note},
                     {"scale", r.scale},      {"scale_how", r.scale_how},
                     {"us_stored", r.stored_total_us}, {"layer_share", r.call.layer_share},
                     {"work_scale", r.call.work_scale}};
    if (r.answer.energy_uj) j["energy_uj_per_call"] = *r.answer.energy_uj;
    if (r.answer.stand_in_for) j["stand_in_for"] = *r.answer.stand_in_for;  // Note [kernels that cannot run the shape]
    if (!r.call.spread.empty()) {  // Note [moe row spread]: [rows, expected experts] pairs
      nlohmann::json spread = nlohmann::json::array();
      for (const RowsShare& x : r.call.spread) spread.push_back({x.rows, x.experts});
      j["row_spread"] = spread;
    }
    a.push_back(j);
  }
  return a;
}

nlohmann::json phase_json(const ModelSpec& m, const PhaseEstimate& p) {
  const Workload& w = p.workload;
  return {{"phase", phase_name(w.phase)},
          {"batch", w.batch},
          {"tokens_per_sequence", w.tokens},
          {"context", w.context},
          {"tokens", w.total_tokens()},
          {"layer", rows_json(p.layer)},
          {"layer_us", p.layer_us},
          {"layers", m.layers},
          {"head", rows_json(p.head)},
          {"head_us", p.head_us},
          {"total_us", p.total_us},
          {"layer_stored_us", p.layer_stored_us},
          {"head_stored_us", p.head_stored_us},
          {"total_stored_us", p.total_stored_us}};
}

}  // namespace

std::string format_estimate(const Estimate& e) {
  const ModelSpec& m = e.model;
  std::string s = fmt::format("{} ({}, {}): {} layers, hidden {}, {} q / {} kv heads x {}, vocab {}{}{}\n", m.name,
                              m.architecture, family_name(m.family), m.layers, m.hidden, m.heads, m.kv_heads,
                              m.head_dim, m.vocab,
                              m.is_moe() ? fmt::format(", {} experts (top {})", m.experts, m.experts_per_token) : "",
                              m.window_layers > 0 ? fmt::format(", {}-position sliding window on {} layers",
                                                                m.sliding_window, m.window_layers)
                                                  : "");
  if (!m.defaulted.empty()) {  // Note [missing fields] (config.cpp)
    std::string list;
    for (const std::string& d : m.defaulted) list += (list.empty() ? "" : ", ") + d;
    s += "not in the file, the " + std::string(family_name(m.family)) + " config class's default: " + list + "\n";
  }
  s += fmt::format("system {}, impl {}, input {} tokens, output {} tokens\n", e.system, e.options.impl,
                   e.options.input_len, e.options.output_len);
  const bool is_scaled = e.options.now.known();
  if (is_scaled)
    s += fmt::format("scaled to the ceilings measured now: copy {:.1f} GB/s, GEMM {:.1f} GFLOP/s (each row by the "
                     "ceiling that bounds it; stored rows' totals in parentheses)\n",
                     e.options.now.copy_gbps, e.options.now.gemm_gflops);
  s += "\n" + format_phase(m, e.prefill, is_scaled);
  s += format_phase(m, e.decode, is_scaled);
  s += fmt::format("TTFT {:.3f} ms   TPOT {:.3f} ms   {:.1f} tokens/s (batch {} / TPOT)\n", e.ttft_us / 1e3,
                   e.tpot_us / 1e3, e.tokens_per_s, e.options.batch);
  if (is_scaled)
    s += fmt::format("stored rows unscaled: TTFT {:.3f} ms   TPOT {:.3f} ms\n", e.ttft_stored_us / 1e3,
                     e.tpot_stored_us / 1e3);
  return s;
}

std::string estimate_json(const Estimate& e) {
  const ModelSpec& m = e.model;
  nlohmann::json j{{"model", m.name},
                   {"config", m.path},
                   {"architecture", m.architecture},
                   {"family", family_name(m.family)},
                   {"system", e.system},
                   {"impl", e.options.impl},
                   {"dtype", e.options.dtype},
                   {"tp", e.options.tp},
                   {"batch", e.options.batch},
                   {"input_len", e.options.input_len},
                   {"output_len", e.options.output_len},
                   {"decode_context", e.decode.workload.context},
                   {"prefill", phase_json(m, e.prefill)},
                   {"decode", phase_json(m, e.decode)},
                   {"ttft_us", e.ttft_us},
                   {"tpot_us", e.tpot_us},
                   {"tokens_per_s", e.tokens_per_s},
                   {"ttft_stored_us", e.ttft_stored_us},
                   {"tpot_stored_us", e.tpot_stored_us}};
  if (!m.defaulted.empty()) j["defaulted_fields"] = m.defaulted;
  if (m.window_layers > 0) j["sliding_window"] = {{"window", m.sliding_window}, {"layers", m.window_layers}};
  if (e.options.now.known())
    j["ceilings_now"] = {{"copy_gbps", e.options.now.copy_gbps}, {"gemm_gflops", e.options.now.gemm_gflops}};
  return j.dump(2);
}

void write_estimate_json(const Estimate& e, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCode::io, "cannot write " + path);
  f << estimate_json(e) << "\n";
  if (!f) throw Error(ErrorCode::io, "cannot write " + path);
}

// ---- support -------------------------------------------------------------------------------

std::vector<SupportRow> model_support(const ModelSpec& m, const perfdb::Database& db, const EstimateOptions& o) {
  validate_options(m, o);
  std::vector<SupportRow> out;
  for (const Workload& w : {prefill_of(o), decode_of(o)}) {
    for (const char* block : {"layer", "head"}) {
      const std::vector<OpCall> calls = std::string(block) == "layer" ? decoder_layer(m, w) : model_head(m, w);
      for (const OpCall& c : calls) {
        SupportRow r;
        r.phase = w.phase;
        r.block = block;
        r.call = c;
        try {
          Answer a = answer_call(db, c, o.impl, w.dtype);
          r.ok = true;
          r.status = perfdb::method_name(a.method);
          r.detail = a.impl + (a.how.empty() ? "" : ": " + a.how);
        } catch (const PerfDataNotAvailable& e) {
          r.status = "missing";
          r.detail = e.what();
        }
        out.push_back(std::move(r));
      }
    }
  }
  return out;
}

std::string format_support(const std::vector<SupportRow>& rows) {
  std::string s = fmt::format("{:<8} {:<6} {:<16} {:<26} {:<56} {:<13} {}\n", "phase", "block", "call", "op", "shapes",
                              "status", "detail");
  int missing = 0;
  for (const SupportRow& r : rows) {
    missing += r.ok ? 0 : 1;
    s += fmt::format("{:<8} {:<6} {:<16} {:<26} {:<56} {:<13} {}\n", phase_name(r.phase), r.block, r.call.name,
                     r.call.op.empty() ? "(modelled)" : r.call.op, dims_str(r.call.dims, r.call.op), r.status, r.detail);
  }
  s += missing ? fmt::format("{} of {} calls have no data\n", missing, rows.size())
               : fmt::format("all {} calls answered\n", rows.size());
  return s;
}

}  // namespace opforge::model
