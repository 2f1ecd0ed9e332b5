// run-layer: one decoder layer from opforge ops with random weights, timed (run_layer.h).
//
// Note [layer timing]: every step is bracketed by a host clock (after a device synchronize on
// CUDA), the steps of one name are summed within a repetition, and each row reports the median
// over the repetitions. On the CPU the layer time is the median of the per-repetition sums (of
// the fastest pass, Note [layer passes]). On a GPU the per-step synchronizes would add the host's
// launch and wait time to every step, which the database (device time of graph replays) does not
// hold; there the layer is timed again as a whole through the device timer: graph_layers layers
// (default 20) captured in one CUDA graph and replayed max(repeat, 5) times between events after
// 3 warm-up layers ("device graph"), or events around plain calls when a step cannot be captured
// ("device events", e.g. a host-staged step). That is how the collector times a row (a graph of
// 20 calls replayed 20 times): a GPU's clock follows its power draw within milliseconds, and a
// GEMM-heavy layer timed as one short graph ran at a higher clock than the collector's sustained
// replays of the same GEMMs (docs/perf/estimator.md, 2026-11-28). A step that runs as a host loop
// on a GPU (the qkv split on a device without a strided copy) copies through the host; its run is
// flagged host_staged and is not a validation. Weights are uniform in +-1/sqrt(fan_in),
// activations in +-1, so no value grows to inf or denormal over repetitions.
#include "model/run_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "opforge/dtype.h"
#include "opforge/error.h"
#include "opforge/registry.h"

namespace opforge::model {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    default: store_from_double(p, t, i, v);
  }
}

class Layer {
 public:
  Layer(const ModelSpec& m, const RunLayerOptions& o)
      : m_(m), w_(o.workload), o_(o), reg_(global_registry()), device_(parse_device(o.device)),
        dt_(parse_dtype(o.workload.dtype)), s_(tp_shapes(m, o.workload.tp)) {
    validate_workload(m, w_);
    if (o.repeat < 1) throw Error(ErrorCode::invalid_argument, "--repeat: expected at least 1, got " + std::to_string(o.repeat));
    if (o.passes < 0)
      throw Error(ErrorCode::invalid_argument, "--passes: expected 0 (the device's default) or more, got " +
                                                   std::to_string(o.passes));
    if (o.graph_layers < 1)
      throw Error(ErrorCode::invalid_argument,
                  "--graph-layers: expected at least 1, got " + std::to_string(o.graph_layers));
    if (device_.kind != DeviceKind::cpu && !device_memory_ops(device_.kind))
      throw Error(ErrorCode::not_available, "run-layer: device " + device_.str() + " is not available in this build");
    build();
  }

  LayerRun run() {
    for (int i = 0; i < o_.warmup; ++i) once();
    // Note [layer passes]: on the CPU the repetitions run in passes and the pass with the smallest
    // median layer time is kept, rows included, as the collector keeps each point's fastest pass
    // (Note [passes over a line] in src/perfdb/collect.cpp): a shared VM's speed drifts by 10%
    // over minutes, and both sides of the comparison should take it the same way.
    const int passes = o_.passes > 0 ? o_.passes : device_.kind == DeviceKind::cpu ? 3 : 1;
    std::map<std::string, std::vector<double>> samples;
    std::vector<double> totals;
    for (int pass = 0; pass < passes; ++pass) {
      std::map<std::string, std::vector<double>> pass_samples;
      std::vector<double> pass_totals;
      for (int r = 0; r < o_.repeat; ++r) {
        rep_.clear();
        once();
        double total = 0;
        for (auto& [name, us] : rep_) {
          pass_samples[name].push_back(us);
          total += us;
        }
        pass_totals.push_back(total);
      }
      if (totals.empty() || median(pass_totals) < median(totals)) {
        samples = std::move(pass_samples);
        totals = std::move(pass_totals);
      }
    }
    double whole_us = -1;
    const DeviceMemoryOps* dev = device_memory_ops(device_.kind);
    if (device_.kind != DeviceKind::cpu && dev && dev->time_calls_us) {
      whole_layer_ = true;
      auto fn = [](void* p) { static_cast<Layer*>(p)->once(); };
      try {
        whole_us = dev->time_calls_us(fn, this, 3, o_.graph_layers, std::max(o_.repeat, 5), device_.index);
      } catch (...) {
        whole_layer_ = false;
        throw;
      }
      whole_layer_ = false;
    }
    LayerRun out;
    out.workload = w_;
    out.device = device_.str();
    out.repeat = o_.repeat;
    out.passes = passes;
    for (MeasuredRow row : order_) {
      row.us = median(samples[row.name]);
      out.rows.push_back(row);
    }
    out.layer_us = median(totals);
    out.layer_timing = "host clock, sum of steps";
    out.host_staged = host_staged_;
    if (whole_us > 0) {
      out.layer_us = whole_us;
      out.graph_layers = o_.graph_layers;
      out.layer_timing = fmt::format("{} of {} layers", host_staged_ ? "device events" : "device graph", o_.graph_layers);
    }
    return out;
  }

 private:
  // ---- tensors ----
  Tensor make(const Shape& shape, DType dt, double scale) {
    Tensor host = Tensor::empty(shape, dt, Device::cpu());
    const int64_t n = host.numel();
    if (dt == DType::i32 || dt == DType::i64) {
      std::memset(host.data(), 0, size_t(host.nbytes()));
    } else {
      // A random block of 4096 values, tiled: filling gigabytes of expert weights stays cheap.
      std::vector<float> block(4096);
      for (float& v : block) v = float(scale * (2.0 * uniform_(rng_) - 1.0));
      const int64_t first = std::min<int64_t>(n, 4096 + 7);  // 4103: rows do not repeat in phase
      for (int64_t i = 0; i < first; ++i) store(host.data(), dt, i, block[size_t(i % 4096)]);
      const int64_t es = dtype_size(dt);
      for (int64_t i = first; i < n; i += first)
        std::memcpy(static_cast<char*>(host.data()) + i * es, host.data(), size_t(std::min(first, n - i) * es));
    }
    if (device_.kind == DeviceKind::cpu) return host;
    Tensor d = Tensor::empty(shape, dt, device_);
    copy_bytes(d.data(), device_, host.data(), Device::cpu(), host.nbytes());
    return d;
  }
  Tensor act(const Shape& s) { return make(s, dt_, 1.0); }
  Tensor weight(const Shape& s, int64_t fan_in) { return make(s, dt_, 1.0 / std::sqrt(double(fan_in))); }
  Tensor norm_weight(int64_t n) { return make(Shape{n}, dt_, 0.5); }
  Tensor host_ints(const std::vector<int64_t>& values, DType dt) {
    Tensor host = Tensor::empty(Shape{int64_t(values.size())}, dt, Device::cpu());
    for (size_t i = 0; i < values.size(); ++i) store_from_double(host.data(), dt, int64_t(i), double(values[i]));
    if (device_.kind == DeviceKind::cpu) return host;
    Tensor d = Tensor::empty(host.shape(), dt, device_);
    copy_bytes(d.data(), device_, host.data(), Device::cpu(), host.nbytes());
    return d;
  }
  // Rows [begin, begin + count) of a 2-D contiguous tensor.
  TensorView rows(const Tensor& t, int64_t begin, int64_t count) const {
    const int64_t cols = t.shape()[1];
    return TensorView(static_cast<char*>(t.data()) + begin * cols * dtype_size(t.dtype()), t.dtype(),
                      Shape{count, cols}, device_);
  }
  TensorView reshaped(const Tensor& t, const Shape& s) const { return TensorView(t.data(), t.dtype(), s, device_); }

  // ---- timing ----
  void note_row(const std::string& name, const std::string& op, const std::string& kernel, const std::string& shapes) {
    for (MeasuredRow& r : order_)
      if (r.name == name) {
        if (first_pass_) r.calls += 1;
        return;
      }
    order_.push_back({name, op, kernel, shapes, 1, 0});
  }
  template <class F> void timed(const std::string& name, F&& f) {
    const DeviceMemoryOps* dev = device_memory_ops(device_.kind);
    if (whole_layer_) return f();  // Note [layer timing]: no per-step synchronize
    auto t0 = Clock::now();
    f();
    if (device_.kind != DeviceKind::cpu && dev && dev->synchronize) dev->synchronize(device_.index);
    rep_[name] += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  void op(const std::string& name, const std::string& op_name, std::vector<Value> values, const std::string& shapes) {
    auto it = decisions_.find(op_name);
    if (it == decisions_.end()) it = decisions_.emplace(op_name, reg_.decide(reg_.op(op_name), o_.policy, device_)).first;
    const KernelEntry* ran = nullptr;
    timed(name, [&] { ran = &reg_.call(it->second, values); });
    note_row(name, op_name, ran->impl(), shapes);
  }
  void host(const std::string& name, const std::string& shapes, const std::function<void()>& f) {
    timed(name, f);
    host_staged_ |= device_.kind != DeviceKind::cpu;
    note_row(name, "", device_.kind == DeviceKind::cpu ? "host loop" : "host loop (staged)", shapes);
  }

  // ---- the layer ----
  void build();
  void once();
  void attention_block();
  void qkv_split();
  void mlp_block(const Tensor& x);
  void moe_block(const Tensor& x);

  const ModelSpec& m_;
  Workload w_;
  RunLayerOptions o_;
  const Registry& reg_;
  Device device_;
  DType dt_;
  TpShapes s_;
  std::mt19937_64 rng_{20261126};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  std::map<std::string, Decision> decisions_;
  std::map<std::string, double> rep_;
  std::vector<MeasuredRow> order_;
  bool first_pass_ = true;
  bool whole_layer_ = false;  // timing the layer as a whole: steps run without synchronizing
  bool host_staged_ = false;

  int64_t T_ = 0;
  Tensor x_, residual_, h_, res2_, qkv_, q_, k_, v_, qn_, kn_, positions_, cos_sin_, attn_out_, lse_, cu_seqlens_;
  Tensor k_cache_, v_cache_, seq_lens_, attn_proj_, o2_, h2_, res3_, gu_, a_, mlp_out_, mlp_out2_;
  Tensor w_in_, w_qkv_, w_qn_, w_kn_, w_o_, w_post_, w_pre_ffn_, w_post_ffn_, w_gu_, w_down_;
  Tensor w_router_, logits_, topk_w_, topk_ids_, gathered_, offsets_, inv_perm_, e_gu_, e_a_, e_out_, w_e_gu_, w_e_down_;
  std::vector<int64_t> offset_;  // expert_offsets of the last untimed-to-host read (Layer::moe_block)
};

void Layer::build() {
  const int64_t H = m_.hidden, D = m_.head_dim, q = s_.q_heads, kv = s_.kv_heads, B = w_.batch;
  T_ = w_.total_tokens();
  x_ = act({T_, H});
  residual_ = act({T_, H});
  h_ = act({T_, H});
  res2_ = act({T_, H});
  w_in_ = norm_weight(H);
  w_qkv_ = weight({(q + 2 * kv) * D, H}, H);
  qkv_ = act({T_, (q + 2 * kv) * D});
  q_ = act({T_, q, D});
  k_ = act({T_, kv, D});
  v_ = act({T_, kv, D});
  if (m_.has_qk_norm()) {
    qn_ = act({T_, q, D});
    kn_ = act({T_, kv, D});
    w_qn_ = norm_weight(D);
    w_kn_ = norm_weight(D);
  }
  const int64_t max_pos = w_.phase == Phase::prefill ? w_.tokens : w_.context + 1;
  std::vector<int64_t> pos(static_cast<size_t>(T_));
  for (int64_t t = 0; t < T_; ++t) pos[size_t(t)] = w_.phase == Phase::prefill ? t % w_.tokens : w_.context;
  positions_ = host_ints(pos, DType::i64);
  cos_sin_ = make({max_pos + 1, D}, dt_, 1.0);
  attn_out_ = act({T_, q, D});
  if (w_.phase == Phase::prefill) {
    lse_ = Tensor::empty({q, T_}, DType::f32, device_);
    std::vector<int64_t> cu(size_t(B + 1));
    for (int64_t b = 0; b <= B; ++b) cu[size_t(b)] = b * w_.tokens;
    cu_seqlens_ = host_ints(cu, DType::i32);
  } else {
    k_cache_ = act({B, w_.context, kv, D});
    v_cache_ = act({B, w_.context, kv, D});
    seq_lens_ = host_ints(std::vector<int64_t>(size_t(B), w_.context), DType::i32);
  }
  w_o_ = weight({H, q * D}, q * D);
  attn_proj_ = act({T_, H});
  w_post_ = norm_weight(H);
  h2_ = act({T_, H});
  res3_ = act({T_, H});
  if (m_.is_gemma()) {
    o2_ = act({T_, H});
    w_pre_ffn_ = norm_weight(H);
    w_post_ffn_ = norm_weight(H);
    mlp_out2_ = act({T_, H});
  }
  mlp_out_ = act({T_, H});
  if (m_.is_moe()) {
    const int64_t E = m_.experts, k = m_.experts_per_token, I = s_.moe_intermediate;
    w_router_ = weight({E, H}, H);
    logits_ = act({T_, E});
    topk_w_ = Tensor::empty({T_, k}, DType::f32, device_);
    topk_ids_ = Tensor::empty({T_, k}, DType::i32, device_);
    gathered_ = act({T_ * k, H});
    offsets_ = Tensor::empty({E + 1}, DType::i64, device_);
    inv_perm_ = Tensor::empty({T_ * k}, DType::i32, device_);
    e_gu_ = act({T_ * k, 2 * I});
    e_a_ = act({T_ * k, I});
    e_out_ = act({T_ * k, H});
    w_e_gu_ = weight({E * 2 * I, H}, H);
    w_e_down_ = weight({E * H, I}, I);
  } else {
    const int64_t I = s_.intermediate;
    w_gu_ = weight({2 * I, H}, H);
    gu_ = act({T_, 2 * I});
    a_ = act({T_, I});
    w_down_ = weight({H, I}, I);
  }
}

std::string sh(const std::vector<std::pair<const char*, int64_t>>& dims) {
  std::string s;
  for (const auto& [n, v] : dims) s += (s.empty() ? "" : " ") + fmt::format("{}={}", n, v);
  return s;
}

void Layer::once() {
  const int64_t H = m_.hidden;
  const double eps = m_.rms_norm_eps;
  if (m_.is_gemma())
    op("input_norm", "gemma_fused_add_rms_norm", {h_.view(), res2_.view(), x_.view(), residual_.view(), w_in_.view(), eps},
       sh({{"tokens", T_}, {"hidden", H}}));
  else
    op("input_norm", "fused_add_rms_norm",
       {h_.view(), res2_.view(), x_.view(), residual_.view(), w_in_.view(), eps, 0.0}, sh({{"tokens", T_}, {"hidden", H}}));
  attention_block();
  const Tensor* mlp_in = &h2_;
  if (m_.is_gemma()) {
    op("post_attn_norm", "gemma_rms_norm", {o2_.view(), attn_proj_.view(), w_post_.view(), eps}, sh({{"tokens", T_}, {"hidden", H}}));
    op("pre_ffn_norm", "gemma_fused_add_rms_norm", {h2_.view(), res3_.view(), o2_.view(), res2_.view(), w_pre_ffn_.view(), eps},
       sh({{"tokens", T_}, {"hidden", H}}));
  } else {
    op("post_attn_norm", "fused_add_rms_norm", {h2_.view(), res3_.view(), attn_proj_.view(), res2_.view(), w_post_.view(), eps, 0.0},
       sh({{"tokens", T_}, {"hidden", H}}));
  }
  if (m_.is_moe())
    moe_block(*mlp_in);
  else
    mlp_block(*mlp_in);
  if (m_.is_gemma())
    op("post_ffn_norm", "gemma_rms_norm", {mlp_out2_.view(), mlp_out_.view(), w_post_ffn_.view(), eps},
       sh({{"tokens", T_}, {"hidden", H}}));
  first_pass_ = false;
}

void Layer::attention_block() {
  const int64_t H = m_.hidden, D = m_.head_dim, q = s_.q_heads, kv = s_.kv_heads;
  op("qkv_proj", "linear", {qkv_.view(), h_.view(), w_qkv_.view(), None{}},
     sh({{"tokens", T_}, {"n", (q + 2 * kv) * D}, {"k", H}}));
  qkv_split();
  Tensor* qh = &q_;
  Tensor* kh = &k_;
  if (m_.has_qk_norm()) {
    const std::string norm = m_.is_gemma() ? "gemma_rms_norm" : "rms_norm";
    auto args = [&](const Tensor& y, const Tensor& x, const Tensor& w, int64_t heads) {
      std::vector<Value> v{reshaped(y, {T_ * heads, D}), reshaped(x, {T_ * heads, D}), w.view(), m_.rms_norm_eps};
      if (!m_.is_gemma()) v.push_back(0.0);
      return v;
    };
    op("q_norm", norm, args(qn_, q_, w_qn_, q), sh({{"tokens", T_ * q}, {"hidden", D}}));
    op("k_norm", norm, args(kn_, k_, w_kn_, kv), sh({{"tokens", T_ * kv}, {"hidden", D}}));
    qh = &qn_;
    kh = &kn_;
  }
  op("rotary", "rotary_embedding",
     {positions_.view(), reshaped(*qh, {T_, q * D}), reshaped(*kh, {T_, kv * D}), cos_sin_.view(), D, true},
     sh({{"tokens", T_}, {"q_heads", q}, {"kv_heads", kv}, {"head_size", D}}));
  if (w_.phase == Phase::prefill)
    op("attention", "attention_prefill",
       {attn_out_.view(), lse_.view(), qh->view(), kh->view(), v_.view(), cu_seqlens_.view(), true, 0.0, int64_t(-1)},
       sh({{"batch", w_.batch}, {"tokens", w_.tokens}, {"q_heads", q}, {"kv_heads", kv}, {"head_dim", D}}));
  else
    op("attention", "attention_decode",
       {attn_out_.view(), qh->view(), k_cache_.view(), v_cache_.view(), seq_lens_.view(), 0.0},
       sh({{"batch", w_.batch}, {"context", w_.context}, {"q_heads", q}, {"kv_heads", kv}, {"head_dim", D}}));
  op("o_proj", "linear", {attn_proj_.view(), reshaped(attn_out_, {T_, q * D}), w_o_.view(), None{}},
     sh({{"tokens", T_}, {"n", H}, {"k", q * D}}));
}

// Copies host-side when the layer runs on another device (a staged copy; its time is then not
// representative and the row says so).
void Layer::qkv_split() {
  const int64_t D = m_.head_dim, q = s_.q_heads, kv = s_.kv_heads, es = dtype_size(dt_);
  const int64_t row = (q + 2 * kv) * D;
  const std::string shapes = sh({{"bytes", 2 * T_ * row * es}});
  const DeviceMemoryOps* dev = device_memory_ops(device_.kind);
  if (device_.kind != DeviceKind::cpu && dev && dev->copy_rows_async) {
    // Three strided device copies on the current stream (capturable).
    timed("qkv_split", [&] {
      const char* src = static_cast<const char*>(qkv_.data());
      dev->copy_rows_async(q_.data(), q * D * es, src, row * es, q * D * es, T_, device_.index);
      dev->copy_rows_async(k_.data(), kv * D * es, src + q * D * es, row * es, kv * D * es, T_, device_.index);
      dev->copy_rows_async(v_.data(), kv * D * es, src + (q + kv) * D * es, row * es, kv * D * es, T_, device_.index);
    });
    note_row("qkv_split", "", "device copy", shapes);
    return;
  }
  host("qkv_split", shapes, [&] {
    const bool on_cpu = device_.kind == DeviceKind::cpu;
    Tensor src = on_cpu ? qkv_ : Tensor::copy_of(qkv_.view(), Device::cpu(), dt_);
    Tensor dq = on_cpu ? q_ : Tensor::empty(q_.shape(), dt_), dk = on_cpu ? k_ : Tensor::empty(k_.shape(), dt_),
           dv = on_cpu ? v_ : Tensor::empty(v_.shape(), dt_);
    const char* s = static_cast<const char*>(src.data());
#pragma omp parallel for schedule(static) if (T_ * m_.hidden > (1 << 16))
    for (int64_t t = 0; t < T_; ++t) {
      const char* r = s + t * row * es;
      std::memcpy(static_cast<char*>(dq.data()) + t * q * D * es, r, size_t(q * D * es));
      std::memcpy(static_cast<char*>(dk.data()) + t * kv * D * es, r + q * D * es, size_t(kv * D * es));
      std::memcpy(static_cast<char*>(dv.data()) + t * kv * D * es, r + (q + kv) * D * es, size_t(kv * D * es));
    }
    if (!on_cpu) {
      copy_bytes(q_.data(), device_, dq.data(), Device::cpu(), dq.nbytes());
      copy_bytes(k_.data(), device_, dk.data(), Device::cpu(), dk.nbytes());
      copy_bytes(v_.data(), device_, dv.data(), Device::cpu(), dv.nbytes());
    }
  });
}

void Layer::mlp_block(const Tensor& x) {
  const int64_t H = m_.hidden, I = s_.intermediate;
  op("gate_up_proj", "linear", {gu_.view(), x.view(), w_gu_.view(), None{}}, sh({{"tokens", T_}, {"n", 2 * I}, {"k", H}}));
  if (m_.is_gemma())
    op("act", "gelu_and_mul", {a_.view(), gu_.view(), std::string("tanh")}, sh({{"tokens", T_}, {"d", I}}));
  else
    op("act", "silu_and_mul", {a_.view(), gu_.view()}, sh({{"tokens", T_}, {"d", I}}));
  op("down_proj", "linear", {mlp_out_.view(), a_.view(), w_down_.view(), None{}}, sh({{"tokens", T_}, {"n", H}, {"k", I}}));
}

// MoE: real routing on random logits; moe_permute groups each (token, slot) pair's row by expert,
// each expert with rows runs its GEMMs at its own count, moe_unpermute sums the k rows of a token
// weighted by topk_weights. The per-expert row counts come to the host once, outside the timing
// (the logits are the same every repetition, so is the routing): the timed layer is what a
// grouped GEMM would launch, without a host round trip per layer.
void Layer::moe_block(const Tensor& x) {
  const int64_t H = m_.hidden, E = m_.experts, k = m_.experts_per_token, I = s_.moe_intermediate;
  const std::string routing = sh({{"tokens", T_}, {"hidden", H}, {"experts", E}, {"k", k}});
  op("router", "linear", {logits_.view(), x.view(), w_router_.view(), None{}}, sh({{"tokens", T_}, {"n", E}, {"k", H}}));
  op("topk_softmax", "topk_softmax", {topk_w_.view(), topk_ids_.view(), logits_.view(), k, m_.norm_topk_prob},
     sh({{"tokens", T_}, {"experts", E}, {"k", k}}));
  op("moe_permute", "moe_permute", {gathered_.view(), offsets_.view(), inv_perm_.view(), x.view(), topk_ids_.view(), E},
     routing);
  if (!whole_layer_) {  // outside timed(): the counts of this repetition's routing
    offset_.assign(size_t(E + 1), 0);
    copy_bytes(offset_.data(), Device::cpu(), offsets_.data(), device_, (E + 1) * int64_t(sizeof(int64_t)));
  }
  const std::string note_gu = fmt::format("rows per expert, n={} k={}", 2 * I, H);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = offset_[size_t(e + 1)] - offset_[size_t(e)];
    if (n == 0) continue;
    op("expert_gate_up", "linear",
       {rows(e_gu_, offset_[size_t(e)], n), rows(gathered_, offset_[size_t(e)], n), rows(w_e_gu_, e * 2 * I, 2 * I), None{}},
       note_gu);
  }
  op("expert_act", "silu_and_mul", {e_a_.view(), e_gu_.view()}, sh({{"tokens", T_ * k}, {"d", I}}));
  const std::string note_down = fmt::format("rows per expert, n={} k={}", H, I);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = offset_[size_t(e + 1)] - offset_[size_t(e)];
    if (n == 0) continue;
    op("expert_down", "linear",
       {rows(e_out_, offset_[size_t(e)], n), rows(e_a_, offset_[size_t(e)], n), rows(w_e_down_, e * H, H), None{}},
       note_down);
  }
  op("moe_unpermute", "moe_unpermute", {mlp_out_.view(), e_out_.view(), inv_perm_.view(), topk_w_.view()}, routing);
}

// Rows of the estimate by name, all_reduce left out (not run on one device).
std::map<std::string, const EstimateRow*> predicted_by_name(const std::vector<EstimateRow>* predicted, double& total,
                                                            double& stored_total) {
  std::map<std::string, const EstimateRow*> by;
  total = stored_total = 0;
  if (!predicted) return by;
  for (const EstimateRow& r : *predicted) {
    if (r.call.op == "all_reduce") continue;
    by[r.call.name] = &r;
    total += r.total_us;
    stored_total += r.stored_total_us;
  }
  return by;
}

}  // namespace

LayerRun run_layer(const ModelSpec& m, const RunLayerOptions& o) {
  Layer layer(m, o);
  return layer.run();
}

std::string format_run(const ModelSpec& m, const LayerRun& run, const std::vector<EstimateRow>* predicted,
                       const std::string& system) {
  const Workload& w = run.workload;
  std::string s = fmt::format("{}: one decoder layer, {} on {}, {}, median of {} repetitions{}\n", m.name,
                              w.phase == Phase::prefill
                                  ? fmt::format("prefill {} x {} tokens", w.batch, w.tokens)
                                  : fmt::format("decode batch {} at context {}", w.batch, w.context),
                              run.device, w.dtype, run.repeat,
                              run.passes > 1 ? fmt::format(", the fastest of {} passes", run.passes) : "");
  double ptotal = 0, pstored = 0;
  auto by = predicted_by_name(predicted, ptotal, pstored);
  if (predicted && run.ceilings_now.known())
    s += fmt::format("  predictions scaled to the ceilings measured around the run (Note [ceilings now]): copy {:.1f} "
                     "GB/s, GEMM {:.1f} GFLOP/s\n",
                     run.ceilings_now.copy_gbps, run.ceilings_now.gemm_gflops);
  s += fmt::format("  {:<16} {:<24} {:<18} {:<56} {:>5} {:>11}", "op", "op name", "kernel", "shapes", "calls", "measured us");
  s += predicted ? fmt::format(" {:>12} {:>7}\n", "predicted us", "pred/meas") : "\n";
  for (const MeasuredRow& r : run.rows) {
    s += fmt::format("  {:<16} {:<24} {:<18} {:<56} {:>5} {:>11.2f}", r.name, r.op.empty() ? "-" : r.op, r.kernel,
                     r.shapes, r.calls, r.us);
    if (predicted) {
      auto it = by.find(r.name);
      s += it == by.end() ? fmt::format(" {:>12}\n", "-")
                          : fmt::format(" {:>12.2f} {:>7.2f}\n", it->second->total_us, it->second->total_us / r.us);
    } else {
      s += "\n";
    }
  }
  s += fmt::format("  layer: measured {:.2f} us ({})", run.layer_us, run.layer_timing);
  if (predicted)
    s += fmt::format(", predicted {:.2f} us on system {} (pred/meas {:.3f}){}", ptotal, system, ptotal / run.layer_us,
                     w.tp > 1 ? "; all-reduces left out on both sides" : "");
  if (predicted && run.ceilings_now.known())
    s += fmt::format("; stored rows unscaled {:.2f} us (pred/meas {:.3f})", pstored, pstored / run.layer_us);
  if (run.host_staged)
    s += "\n  note: some steps ran as host loops with copies through the host (Note [layer timing]); "
         "this run is not a validation of the estimate";
  return s + "\n";
}

std::string run_json(const ModelSpec& m, const LayerRun& run, const std::vector<EstimateRow>* predicted,
                     const std::string& system) {
  double ptotal = 0, pstored = 0;
  auto by = predicted_by_name(predicted, ptotal, pstored);
  nlohmann::json rows = nlohmann::json::array();
  for (const MeasuredRow& r : run.rows) {
    nlohmann::json j{{"name", r.name}, {"op", r.op},         {"kernel", r.kernel},
                     {"shapes", r.shapes}, {"calls", r.calls}, {"measured_us", r.us}};
    if (auto it = by.find(r.name); it != by.end()) {
      j["predicted_us"] = it->second->total_us;
      j["predicted_method"] = perfdb::method_name(it->second->answer.method);
      j["predicted_stored_us"] = it->second->stored_total_us;
    }
    rows.push_back(j);
  }
  const Workload& w = run.workload;
  nlohmann::json j{{"model", m.name},       {"phase", phase_name(w.phase)}, {"batch", w.batch},
                   {"tokens", w.tokens},    {"context", w.context},         {"tp", w.tp},
                   {"dtype", w.dtype},      {"device", run.device},         {"repeat", run.repeat},
                   {"rows", rows},          {"layer_measured_us", run.layer_us},
                   {"layer_timing", run.layer_timing}, {"passes", run.passes},
                   {"graph_layers", run.graph_layers}, {"host_staged", run.host_staged}};
  if (predicted) {
    j["system"] = system;
    j["layer_predicted_us"] = ptotal;
    j["ratio_predicted_to_measured"] = ptotal / run.layer_us;
    j["layer_predicted_stored_us"] = pstored;
    j["ratio_stored_to_measured"] = pstored / run.layer_us;
    if (run.ceilings_now.known())
      j["ceilings_now"] = {{"copy_gbps", run.ceilings_now.copy_gbps}, {"gemm_gflops", run.ceilings_now.gemm_gflops}};
  }
  return j.dump(2);
}

}  // namespace opforge::model
