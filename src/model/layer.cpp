// The decoder layer of each family as op calls with database dims (docs/design.md, "Estimator").
//
// Steady-state layer of vLLM's forward: the input norm adds the previous layer's MLP output to the
// residual stream (fused_add_rms_norm; only layer 0 uses a plain rms_norm, a difference below the
// noise of one norm), the fused qkv GEMM, the split of its output into contiguous q, k, v (opforge's
// attention takes contiguous heads; vLLM moves the k/v part of these bytes when it writes the KV
// cache), [q/k norm per head], rotary, attention, o_proj, [all_reduce], the post-attention norm
// that adds the attention output to the residual, the MLP (or MoE block), [all_reduce].
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/model.h"
#include "opforge/dtype.h"
#include "opforge/error.h"

namespace opforge::model {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::invalid_argument, what); }

OpCall call(std::string name, std::string op, perfdb::Dims dims, int64_t count = 1, std::string note = "") {
  OpCall c;
  c.name = std::move(name);
  c.op = std::move(op);
  c.dims = std::move(dims);
  c.count = count;
  c.note = std::move(note);
  return c;
}

OpCall modelled(std::string name, double bytes, std::string note) {
  OpCall c;
  c.name = std::move(name);
  c.op = "";
  c.dims = {{"bytes", int64_t(bytes)}};
  c.modelled_bytes = bytes;
  c.note = std::move(note);
  return c;
}

int64_t element_size(const Workload& w) { return dtype_size(parse_dtype(w.dtype)); }

// Row norm: plain or Gemma's (1 + w) form; `fused` adds the residual first.
std::string norm_op(const ModelSpec& m, bool fused) {
  if (m.is_gemma()) return fused ? "gemma_fused_add_rms_norm" : "gemma_rms_norm";
  return fused ? "fused_add_rms_norm" : "rms_norm";
}

void all_reduce(std::vector<OpCall>& calls, const char* name, const Workload& w, int64_t hidden) {
  if (w.tp <= 1) return;
  calls.push_back(call(name, "all_reduce", {{"message_bytes", w.total_tokens() * hidden * element_size(w)}, {"tp", w.tp}}));
}

void dense_mlp(std::vector<OpCall>& calls, const ModelSpec& m, const TpShapes& s, int64_t T) {
  calls.push_back(call("gate_up_proj", "linear", {{"tokens", T}, {"n", 2 * s.intermediate}, {"k", m.hidden}}));
  calls.push_back(call("act", m.is_gemma() ? "gelu_and_mul" : "silu_and_mul", {{"tokens", T}, {"d", s.intermediate}},
                       1, m.is_gemma() ? "approximate=tanh" : ""));
  calls.push_back(call("down_proj", "linear", {{"tokens", T}, {"n", m.hidden}, {"k", s.intermediate}}));
}

// Note [moe expected load]: the router sends T*k (token, expert) pairs to E experts. Under uniform
// routing the expected number of distinct experts hit is E(1 - (1 - k/E)^T), shown as the calls of
// the expert GEMMs with their mean rows ceil(T*k / active); the GEMMs are costed over the spread of
// the rows (Note [moe row spread]). At small batches this counts only the experts that run (decode
// at batch 1 runs k experts, not E). The activation runs once over all T*k rows. moe_permute
// groups the T*k rows by expert before the expert GEMMs and moe_unpermute sums each token's k rows
// after them, as run-layer runs them.
void moe_block(std::vector<OpCall>& calls, const ModelSpec& m, const TpShapes& s, const Workload& w, int64_t T) {
  const int64_t E = m.experts, k = m.experts_per_token, H = m.hidden;
  const int64_t pairs = T * k;
  const int64_t active = expected_active_experts(E, k, T);
  const int64_t rows = (pairs + active - 1) / active;
  const std::string note = str(active) + " of " + str(E) + " experts expected active, " + str(rows) +
                           " rows each (Note [moe expected load])";
  calls.push_back(call("router", "linear", {{"tokens", T}, {"n", E}, {"k", H}}));
  calls.push_back(call("topk_softmax", "topk_softmax", {{"tokens", T}, {"experts", E}, {"k", k}}, 1,
                       m.norm_topk_prob ? "renormalize" : ""));
  const perfdb::Dims routing{{"tokens", T}, {"hidden", H}, {"experts", E}, {"k", k}};
  calls.push_back(call("moe_permute", "moe_permute", routing));
  const std::vector<RowsShare> spread = expert_row_spread(E, k, T);
  calls.push_back(call("expert_gate_up", "linear", {{"tokens", rows}, {"n", 2 * s.moe_intermediate}, {"k", H}},
                       active, note));
  calls.back().spread = spread;
  calls.push_back(call("expert_act", "silu_and_mul", {{"tokens", pairs}, {"d", s.moe_intermediate}}));
  calls.push_back(call("expert_down", "linear", {{"tokens", rows}, {"n", H}, {"k", s.moe_intermediate}}, active, note));
  calls.back().spread = spread;
  calls.push_back(call("moe_unpermute", "moe_unpermute", routing));
}

}  // namespace

const char* phase_name(Phase p) { return p == Phase::prefill ? "prefill" : "decode"; }

Workload Workload::prefill(int64_t batch, int64_t tokens, int64_t tp) {
  Workload w;
  w.phase = Phase::prefill;
  w.batch = batch;
  w.tokens = tokens;
  w.tp = tp;
  return w;
}

Workload Workload::decode(int64_t batch, int64_t context, int64_t tp) {
  Workload w;
  w.phase = Phase::decode;
  w.batch = batch;
  w.context = context;
  w.tp = tp;
  return w;
}

// Note [size limits]: a config file or a flag can hold any int64, and the layer multiplies them in
// int64 (a weight's elements, a row block's bytes, the KV cache), as do the tensor views the cost
// models build at the call's dims. A wrapped product would reach a query as a negative or a wrong
// dim, so each product is taken in long double first and refused past kMaxCount (2^53 elements:
// 16 PiB of bf16, far past any model, far from int64's end) with its factors named. The sizes
// are checked where they come in: the weights by parse_model_config, a step's tensors by
// validate_workload. Tokens in one step are bounded tighter, by int32: attention's cu_seqlens and
// positions are int32 in opforge as in vLLM.
void check_product(const std::vector<std::pair<std::string, double>>& factors, const std::string& what) {
  long double p = 1;
  std::string names;
  for (const auto& [name, v] : factors) {
    p *= static_cast<long double>(v);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    names += (names.empty() ? "" : " x ") + name + " " + buf;
  }
  if (p > static_cast<long double>(kMaxCount))
    throw Error(ErrorCode::invalid_argument, what + ": " + names + " is past the 2^53 limit of a count (Note [size limits])");
}

TpShapes tp_shapes(const ModelSpec& m, int64_t tp) {
  if (tp < 1) bad("--tp: expected a tensor-parallel degree >= 1, got " + str(tp));
  if (m.heads % tp != 0)
    bad("--tp " + str(tp) + ": the " + str(m.heads) + " attention heads of " + m.name +
        " do not divide by the tensor-parallel degree");
  TpShapes s;
  s.q_heads = m.heads / tp;
  if (tp <= m.kv_heads) {
    if (m.kv_heads % tp != 0)
      bad("--tp " + str(tp) + ": the " + str(m.kv_heads) + " kv heads of " + m.name + " do not divide by it");
    s.kv_heads = m.kv_heads / tp;
  } else {
    if (tp % m.kv_heads != 0)
      bad("--tp " + str(tp) + ": more GPUs than the " + str(m.kv_heads) + " kv heads of " + m.name +
          " need a multiple of them (each kv head is replicated tp / kv_heads times)");
    s.kv_heads = 1;
  }
  // An MoE model's dense intermediate_size (Qwen3-MoE files carry one) builds no GEMM here.
  if (!m.is_moe() && m.intermediate % tp != 0)
    bad("--tp " + str(tp) + ": intermediate_size " + str(m.intermediate) + " of " + m.name + " does not divide by it");
  s.intermediate = m.intermediate / tp;
  if (m.is_moe()) {
    if (m.moe_intermediate % tp != 0)
      bad("--tp " + str(tp) + ": the expert intermediate size " + str(m.moe_intermediate) + " of " + m.name +
          " does not divide by it");
    s.moe_intermediate = m.moe_intermediate / tp;
  }
  s.vocab = (m.vocab + tp - 1) / tp;
  return s;
}

void validate_workload(const ModelSpec& m, const Workload& w) {
  if (w.batch < 1) bad("--batch: expected at least 1 sequence, got " + str(w.batch));
  if (w.phase == Phase::prefill && w.tokens < 1)
    bad("--input-len: expected at least 1 prompt token, got " + str(w.tokens));
  if (w.phase == Phase::decode && w.context < 1)
    bad("--context: expected a context of at least 1 token, got " + str(w.context));
  DType dt = parse_dtype(w.dtype);  // unknown name -> Error listing the valid ones
  if (!is_floating(dt)) bad("--dtype: expected a floating dtype (bf16, f16, f32), got " + w.dtype);
  const TpShapes s = tp_shapes(m, w.tp);
  // Note [size limits]: tokens of the step and context within int32, then the step's tensors.
  const bool pre = w.phase == Phase::prefill;
  const std::vector<std::pair<std::string, double>> T =
      pre ? std::vector<std::pair<std::string, double>>{{"--batch", double(w.batch)}, {"--input-len", double(w.tokens)}}
          : std::vector<std::pair<std::string, double>>{{"--batch", double(w.batch)}};
  long double tokens = 1;
  for (const auto& f : T) tokens *= static_cast<long double>(f.second);
  if (tokens > 2147483647.0L || w.context > 2147483647)
    bad(std::string(pre ? "--batch " + str(w.batch) + " x --input-len " + str(w.tokens) : "--batch " + str(w.batch)) +
        (w.context > 2147483647 ? ", context " + str(w.context) : "") +
        ": past the 2^31 - 1 tokens of one step that attention's int32 offsets hold (Note [size limits])");
  auto with = [&](std::vector<std::pair<std::string, double>> more) {
    std::vector<std::pair<std::string, double>> f = T;
    f.insert(f.end(), more.begin(), more.end());
    f.emplace_back("dtype bytes", double(dtype_size(dt) * 2));  // the qkv split reads and writes
    return f;
  };
  const double es = double(dtype_size(dt));
  check_product(with({{"q + 2 kv heads per GPU", double(s.q_heads + 2 * s.kv_heads)}, {"head_dim", double(m.head_dim)}}),
                "the qkv block of one step");
  check_product(with({{"hidden_size", double(m.hidden)}}), "the hidden rows of one step");
  if (m.is_moe()) {
    check_product(with({{"num_experts_per_tok", double(m.experts_per_token)},
                        {"2", 2}, {"moe intermediate per GPU", double(s.moe_intermediate)}}),
                  "the expert rows of one step");
    check_product(with({{"num_experts_per_tok", double(m.experts_per_token)}, {"hidden_size", double(m.hidden)}}),
                  "the expert rows of one step");
  } else {
    check_product(with({{"2", 2}, {"intermediate per GPU", double(s.intermediate)}}), "the MLP rows of one step");
  }
  check_product({{"--batch", double(w.batch)}, {"vocab per GPU", double(s.vocab)}, {"dtype bytes", es}},
                "the logits of one step");
  if (!pre)
    check_product({{"--batch", double(w.batch)}, {"context", double(w.context)}, {"kv heads per GPU", double(s.kv_heads)},
                   {"head_dim", double(m.head_dim)}, {"dtype bytes", es}},
                  "the KV cache of one step");
}

int64_t expected_active_experts(int64_t experts, int64_t k, int64_t tokens) {
  const double e = double(experts);
  const double expected = e * (1.0 - std::pow(1.0 - double(k) / e, double(tokens)));
  const int64_t most = std::min(experts, tokens * k);
  return std::clamp<int64_t>(int64_t(std::llround(expected)), std::min<int64_t>(1, most), most);
}

// Note [moe row spread]: under uniform routing a token sends one of its k pairs to a given expert
// with probability p = k/E, independently of the other tokens, so an expert's rows are
// Binomial(T, p) and E * P(rows = r) experts run their GEMMs at r rows. A kernel's time is not
// linear in its rows where it changes plan (the CPU's dot path up to 16 rows, a GPU GEMM's tile
// steps), so an expert GEMM costs sum_r E P(r) t(r) rather than active experts x t(mean rows): at
// 128 tokens of Qwen3-30B-A3B (mean 8 rows, sd 2.7) the experts run from 1 to about 20 rows.
// Row counts whose probability is below 1e-9 are left out; more than kMaxSpreadPoints counts are
// merged into that many bins of equal probability, each at its probability-weighted mean rows
// (rounded; where the spread is that wide its rows are in the tens or more and the time is smooth
// in them). p = 1 (every expert for every token) is T rows for all E.
std::vector<RowsShare> expert_row_spread(int64_t experts, int64_t k, int64_t tokens) {
  std::vector<RowsShare> out;
  if (experts < 1 || k < 1 || tokens < 1) return out;
  const double E = double(experts), T = double(tokens);
  const double p = std::min(1.0, double(k) / E);
  if (p >= 1.0) {
    out.push_back({tokens, E});
    return out;
  }
  const double mean = T * p, sd = std::sqrt(T * p * (1.0 - p));
  const int64_t lo = std::max<int64_t>(1, int64_t(std::floor(mean - 12.0 * sd - 2.0)));
  const int64_t hi = std::min<int64_t>(tokens, int64_t(std::ceil(mean + 12.0 * sd + 2.0)));
  const double log_p = std::log(p), log_q = std::log1p(-p), log_t = std::lgamma(T + 1.0);
  std::vector<std::pair<int64_t, double>> pmf;  // (rows, probability)
  double mass = 0;
  for (int64_t r = lo; r <= hi; ++r) {
    const double x = double(r);
    const double q = std::exp(log_t - std::lgamma(x + 1.0) - std::lgamma(T - x + 1.0) + x * log_p + (T - x) * log_q);
    if (q < 1e-9) continue;
    pmf.emplace_back(r, q);
    mass += q;
  }
  if (pmf.size() <= size_t(kMaxSpreadPoints)) {
    for (const auto& [r, q] : pmf) out.push_back({r, E * q});
    return out;
  }
  // Equal-probability bins: bin b takes the rows whose cumulative mass ends in [b, b + 1) / bins.
  const int bins = kMaxSpreadPoints;
  double acc = 0, bin_q = 0, bin_rq = 0;
  int bin = 0;
  for (size_t i = 0; i < pmf.size(); ++i) {
    const auto& [r, q] = pmf[i];
    acc += q;
    bin_q += q;
    bin_rq += double(r) * q;
    const bool last = i + 1 == pmf.size();
    if (last || acc >= mass * double(bin + 1) / bins) {
      const int64_t rows = std::llround(bin_rq / bin_q);
      if (!out.empty() && out.back().rows == rows) out.back().experts += E * bin_q;
      else out.push_back({rows, E * bin_q});
      bin_q = bin_rq = 0;
      ++bin;
    }
  }
  return out;
}

// Note [sliding-window layers]: Mistral (sliding_window), Gemma 2 (every other layer), Gemma 3
// (five of every six) and Qwen2 / Qwen3 with use_sliding_window give some layers attention over
// the last W positions only (ModelSpec::window_layers of them). The table is the mean layer: the
// full attention call with layer_share = full layers / layers, the windowed one
// ("attention_local") with window layers / layers. Decode reads min(context, W) cached positions,
// so it is attention_decode at that context. A prefill of T > W tokens does, per sequence,
// W (W + 1) / 2 + (T - W) W query-key products instead of the causal T (T + 1) / 2: the full
// prefill's time at T times that ratio (work_scale), an estimate marked in its `how`; the
// database holds no windowed prefill.
void attention_calls(std::vector<OpCall>& calls, const ModelSpec& m, const Workload& w, const TpShapes& s,
                     bool windows) {
  const int64_t L = m.layers, local = windows && m.sliding_window > 0 ? std::min(m.window_layers, L) : 0;
  const int64_t W = m.sliding_window, q = s.q_heads, kv = s.kv_heads, D = m.head_dim;
  auto add = [&](const char* name, int64_t window, int64_t layers) {
    OpCall c;
    std::string note;
    if (w.phase == Phase::prefill) {
      c = call(name, "attention_prefill", {{"batch", w.batch}, {"tokens", w.tokens}, {"q_heads", q}, {"kv_heads", kv}, {"head_dim", D}});
      if (window > 0 && w.tokens > window) {
        const double T = double(w.tokens), Wd = double(window);
        c.work_scale = (Wd * (Wd + 1) / 2 + (T - Wd) * Wd) / (T * (T + 1) / 2);
        char buf[96];
        std::snprintf(buf, sizeof buf, "window %lld: x%.3f of the causal work", static_cast<long long>(window),
                      c.work_scale);
        note = buf;
      } else if (window > 0) {
        note = "window " + str(window) + " >= the tokens";
      }
    } else {
      const int64_t context = window > 0 ? std::min(w.context, window) : w.context;
      c = call(name, "attention_decode", {{"batch", w.batch}, {"context", context}, {"q_heads", q}, {"kv_heads", kv}, {"head_dim", D}});
      if (window > 0) note = "window " + str(window) + ": the last " + str(context) + " positions";
    }
    c.layer_share = double(layers) / double(L);
    if (layers < L) note = (note.empty() ? "" : note + "; ") + str(layers) + " of " + str(L) + " layers";
    c.note = note;
    calls.push_back(std::move(c));
  };
  if (local < L) add("attention", 0, L - local);
  if (local > 0) add("attention_local", W, local);
}

std::vector<OpCall> decoder_layer(const ModelSpec& m, const Workload& w, bool windows) {
  validate_workload(m, w);
  const TpShapes s = tp_shapes(m, w.tp);
  const int64_t T = w.total_tokens(), H = m.hidden, D = m.head_dim, q = s.q_heads, kv = s.kv_heads;
  std::vector<OpCall> calls;
  calls.push_back(call("input_norm", norm_op(m, true), {{"tokens", T}, {"hidden", H}}));
  calls.push_back(call("qkv_proj", "linear", {{"tokens", T}, {"n", (q + 2 * kv) * D}, {"k", H}}));
  calls.push_back(modelled("qkv_split", 2.0 * double(T * (q + 2 * kv) * D * element_size(w)),
                           "copy of the qkv output into contiguous q, k, v"));
  if (m.has_qk_norm()) {
    calls.push_back(call("q_norm", norm_op(m, false), {{"tokens", T * q}, {"hidden", D}}, 1, "per head"));
    calls.push_back(call("k_norm", norm_op(m, false), {{"tokens", T * kv}, {"hidden", D}}, 1, "per head"));
  }
  calls.push_back(call("rotary", "rotary_embedding", {{"tokens", T}, {"q_heads", q}, {"kv_heads", kv}, {"head_size", D}}));
  attention_calls(calls, m, w, s, windows);
  calls.push_back(call("o_proj", "linear", {{"tokens", T}, {"n", H}, {"k", q * D}}));
  all_reduce(calls, "attn_all_reduce", w, H);
  if (m.is_gemma()) {
    calls.push_back(call("post_attn_norm", norm_op(m, false), {{"tokens", T}, {"hidden", H}}));
    calls.push_back(call("pre_ffn_norm", norm_op(m, true), {{"tokens", T}, {"hidden", H}}));
  } else {
    calls.push_back(call("post_attn_norm", norm_op(m, true), {{"tokens", T}, {"hidden", H}}));
  }
  if (m.is_moe())
    moe_block(calls, m, s, w, T);
  else
    dense_mlp(calls, m, s, T);
  all_reduce(calls, "mlp_all_reduce", w, H);
  if (m.is_gemma()) calls.push_back(call("post_ffn_norm", norm_op(m, false), {{"tokens", T}, {"hidden", H}}));
  return calls;
}

std::vector<OpCall> model_head(const ModelSpec& m, const Workload& w) {
  validate_workload(m, w);
  const TpShapes s = tp_shapes(m, w.tp);
  const int64_t T = w.total_tokens();
  std::vector<OpCall> calls;
  // The gather reads `hidden` values per token whatever the vocab; the full table is queried (the
  // vocab-parallel split changes which rank holds a row, not the bytes moved per token).
  calls.push_back(call("embedding", "embedding", {{"tokens", T}, {"vocab", m.vocab}, {"hidden", m.hidden}}));
  all_reduce(calls, "embed_all_reduce", w, m.hidden);
  calls.push_back(call("final_norm", norm_op(m, true), {{"tokens", T}, {"hidden", m.hidden}}));
  // vLLM computes logits only for the last token of each sequence (prefill) and for every new
  // token (decode): `batch` rows either way.
  calls.push_back(call("lm_head", "linear", {{"tokens", w.batch}, {"n", s.vocab}, {"k", m.hidden}}, 1,
                       w.phase == Phase::prefill ? "last token of each sequence" : ""));
  return calls;
}

std::string dims_str(const perfdb::Dims& dims, const std::string& op) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> order = {
      {"linear", {"tokens", "n", "k"}},
      {"rotary_embedding", {"tokens", "q_heads", "kv_heads", "head_size"}},
      {"attention_prefill", {"batch", "tokens", "q_heads", "kv_heads", "head_dim"}},
      {"attention_decode", {"batch", "context", "q_heads", "kv_heads", "head_dim"}},
      {"topk_softmax", {"tokens", "experts", "k"}},
      {"moe_permute", {"tokens", "hidden", "experts", "k"}},
      {"moe_unpermute", {"tokens", "hidden", "experts", "k"}},
      {"embedding", {"tokens", "vocab", "hidden"}},
      {"all_reduce", {"message_bytes", "tp"}},
      {"silu_and_mul", {"tokens", "d"}},
      {"gelu_and_mul", {"tokens", "d"}},
  };
  std::vector<std::string> names;
  for (const auto& [name, list] : order)
    if (name == op) names = list;
  if (names.empty()) names = {"tokens", "hidden"};
  std::string s;
  for (const std::string& n : names)
    if (auto it = dims.find(n); it != dims.end()) s += (s.empty() ? "" : " ") + n + "=" + std::to_string(it->second);
  for (const auto& [n, v] : dims)  // anything not in the order table, by name
    if (std::find(names.begin(), names.end(), n) == names.end()) s += (s.empty() ? "" : " ") + n + "=" + std::to_string(v);
  return s;
}

}  // namespace opforge::model
