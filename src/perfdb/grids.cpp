// The collection grids (Note [collection grids] in opforge/collect.h): which points of each op
// `opforge collect` measures, per grid (quick, full) and device kind.
#include <algorithm>
#include <set>

#include "opforge/collect.h"

namespace opforge::perfdb {

namespace {

struct Model {
  const char* name;
  int64_t hidden, intermediate;  // intermediate 0: every MLP is an MoE
  int64_t q_heads, kv_heads, head_dim, vocab;
  int64_t experts = 0, topk = 0, moe_intermediate = 0;
};

const Model kModels[] = {
    {"Llama-3.1-8B", 4096, 14336, 32, 8, 128, 128256},
    {"Llama-3.1-70B", 8192, 28672, 64, 8, 128, 128256},
    {"Qwen3-8B", 4096, 12288, 32, 8, 128, 151936},
    {"Qwen3-30B-A3B", 2048, 0, 32, 4, 128, 151936, 128, 8, 768},
    {"Mixtral-8x7B", 4096, 0, 32, 8, 128, 32000, 8, 2, 14336},
};

// One model at one TP degree, per GPU.
struct Shard {
  const Model* m;
  int64_t tp;
  int64_t q() const { return m->q_heads / tp; }
  int64_t kv() const { return std::max<int64_t>(1, m->kv_heads / tp); }
  int64_t inter() const { return m->intermediate / tp; }
  int64_t moe_inter() const { return m->moe_intermediate / tp; }
  int64_t vocab() const { return (m->vocab + tp - 1) / tp; }
};

struct GridSpec {
  std::vector<const Model*> models;
  std::vector<int64_t> tp;
  std::vector<int64_t> tokens;          // row-wise ops and GEMMs
  std::vector<int64_t> prefill_batch;   // attention_prefill: batch x tokens
  std::vector<int64_t> decode_batch;    // attention_decode: batch x context
  std::vector<int64_t> context;
  int64_t max_prefill_tokens = 0;       // batch * tokens above this: dropped (0: none)
  bool full = false;
};

// 1, 2, 3, 4, 6, 8, 12, ... up to `last` (powers of two and their midpoints 3 * 2^k).
std::vector<int64_t> pow2_and_mid(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t p = 1; p <= last; p *= 2) {
    if (p >= first) v.push_back(p);
    if (p >= 2 && p + p / 2 <= last && p + p / 2 >= first) v.push_back(p + p / 2);
  }
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> pow2(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t p = 1; p <= last; p *= 2)
    if (p >= first) v.push_back(p);
  return v;
}

std::vector<const Model*> all_models() {
  std::vector<const Model*> v;
  for (const Model& m : kModels) v.push_back(&m);
  return v;
}

const Model* model(const char* name) {
  for (const Model& m : kModels)
    if (std::string(m.name) == name) return &m;
  throw Error(ErrorCode::internal, std::string("perfdb: no model ") + name);
}

GridSpec spec_for(const std::string& grid, DeviceKind device) {
  GridSpec s;
  // The quick grid: powers of 4 plus the points the estimator is validated at (prefill 128, 512,
  // 2048, 8192; decode batch 1, 32, 256 at context 2048), and 32768 to close the range.
  const std::vector<int64_t> quick_tokens = {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  if (grid == "quick") {
    s.tokens = quick_tokens;
    s.prefill_batch = {1, 4, 16};
    s.decode_batch = {1, 4, 16, 32, 64, 256};
    s.context = {128, 512, 2048, 8192, 32768};
  } else if (grid == "full") {
    s.full = true;
    s.tokens = pow2_and_mid(1, 32768);
    s.prefill_batch = pow2(1, 64);
    s.decode_batch = pow2_and_mid(1, 512);
    s.context = pow2_and_mid(128, 32768);
  } else {
    throw Error(ErrorCode::unknown_name, "perfdb: unknown grid '" + grid + "'; valid: quick, full");
  }
  s.max_prefill_tokens = 65536;
  s.models = all_models();
  s.tp = {1, 2, 4, 8};
  if (device == DeviceKind::cpu) {
    // One CPU socket is one "GPU": TP 1 only. The quick grid keeps the two models the estimator
    // is validated with on the CPU, with the batches of its validation points.
    s.tp = {1};
    s.max_prefill_tokens = 8192;
    if (grid == "quick") {
      s.models = {model("Llama-3.1-8B"), model("Qwen3-30B-A3B")};
      s.prefill_batch = {1, 4};
      // Decode: every power of two of batch and context, so that each interior point of the
      // leave-one-out has neighbours at twice and half its size (with only 1, 4, 32 and 512, 2048,
      // 8192 the one interior point of a line was predicted across 8x and 16x spans, where the
      // KV cache leaves one cache level after another).
      s.decode_batch = {1, 2, 4, 8, 16, 32};
      s.context = {512, 1024, 2048, 4096, 8192};
    }
  }
  return s;
}

std::vector<Shard> shards(const GridSpec& s) {
  std::vector<Shard> v;
  for (const Model* m : s.models)
    for (int64_t tp : s.tp)
      if (m->q_heads % tp == 0) v.push_back({m, tp});
  return v;
}

// Expected tokens per expert: ceil(tokens * k / experts), at least 1.
int64_t per_expert(int64_t tokens, const Model& m) {
  return std::max<int64_t>(1, (tokens * m.topk + m.experts - 1) / m.experts);
}

// The raw points of one op (before caps), as dims maps.
std::vector<Dims> raw_points(const std::string& op, const GridSpec& s) {
  std::vector<Dims> pts;
  const std::vector<Shard> sh = shards(s);
  auto over_tokens = [&](const std::vector<int64_t>& tokens, Dims base) {
    for (int64_t t : tokens) {
      base["tokens"] = t;
      pts.push_back(base);
    }
  };
  std::set<int64_t> hiddens;
  for (const Model* m : s.models) hiddens.insert(m->hidden);
  if (op == "rms_norm" || op == "gemma_rms_norm" || op == "fused_add_rms_norm" ||
      op == "gemma_fused_add_rms_norm" || op == "layer_norm") {
    for (int64_t h : hiddens) over_tokens(s.tokens, {{"hidden", h}});
    if (op == "rms_norm" || op == "gemma_rms_norm") {
      // Per-head q/k norms (Qwen3, Gemma 3): tokens * heads rows of head_dim, up to 32 (quick)
      // or 64 (full) heads per token.
      std::vector<int64_t> more = s.full ? pow2_and_mid(1, s.tokens.back() * 64) : pow2(1, s.tokens.back() * 32);
      over_tokens(more, {{"hidden", 128}});
    }
  } else if (op == "silu_and_mul" || op == "gelu_and_mul") {
    std::set<int64_t> dense, moe;
    for (const Shard& x : sh) {
      if (x.m->intermediate) dense.insert(x.inter());
      if (x.m->experts) moe.insert(x.moe_inter());
    }
    for (int64_t d : dense) over_tokens(s.tokens, {{"d", d}});
    // MoE: per expert (tokens per expert) and over all routed rows (tokens * k).
    for (const Shard& x : sh) {
      if (!x.m->experts) continue;
      std::vector<int64_t> t = s.tokens;
      for (int64_t n : s.tokens) {
        t.push_back(per_expert(n, *x.m));
        t.push_back(n * x.m->topk);
      }
      over_tokens(t, {{"d", x.moe_inter()}});
    }
  } else if (op == "rotary_embedding") {
    for (const Shard& x : sh)
      over_tokens(s.tokens, {{"q_heads", x.q()}, {"kv_heads", x.kv()}, {"head_size", x.m->head_dim}});
  } else if (op == "linear") {
    for (const Shard& x : sh) {
      const Model& m = *x.m;
      const int64_t hd = m.head_dim;
      auto gemm = [&](int64_t n, int64_t k) { over_tokens(s.tokens, {{"n", n}, {"k", k}}); };
      gemm((x.q() + 2 * x.kv()) * hd, m.hidden);  // qkv projection
      gemm(m.hidden, x.q() * hd);                 // output projection
      gemm(x.vocab(), m.hidden);                  // lm head
      if (m.intermediate) {
        gemm(2 * x.inter(), m.hidden);            // gate_up
        gemm(m.hidden, x.inter());                // down
      }
      if (m.experts) {
        gemm(m.experts, m.hidden);                // router (replicated)
        std::vector<int64_t> t = s.tokens;
        for (int64_t n : s.tokens) t.push_back(per_expert(n, m));
        over_tokens(t, {{"n", 2 * x.moe_inter()}, {"k", m.hidden}});  // expert gate_up
        over_tokens(t, {{"n", m.hidden}, {"k", x.moe_inter()}});      // expert down
      }
    }
  } else if (op == "attention_prefill") {
    for (const Shard& x : sh)
      for (int64_t b : s.prefill_batch)
        for (int64_t t : s.tokens)
          if (s.max_prefill_tokens == 0 || b * t <= s.max_prefill_tokens)
            pts.push_back({{"batch", b}, {"tokens", t}, {"q_heads", x.q()}, {"kv_heads", x.kv()},
                           {"head_dim", x.m->head_dim}});
  } else if (op == "attention_decode") {
    for (const Shard& x : sh)
      for (int64_t b : s.decode_batch)
        for (int64_t c : s.context)
          pts.push_back({{"batch", b}, {"context", c}, {"q_heads", x.q()}, {"kv_heads", x.kv()},
                         {"head_dim", x.m->head_dim}});
  } else if (op == "topk_softmax") {
    for (const Model* m : s.models)
      if (m->experts) over_tokens(s.tokens, {{"experts", m->experts}, {"k", m->topk}});
  } else if (op == "moe_permute" || op == "moe_unpermute") {
    for (const Model* m : s.models)
      if (m->experts)
        over_tokens(s.tokens, {{"hidden", m->hidden}, {"experts", m->experts}, {"k", m->topk}});
  } else if (op == "embedding") {
    for (const Shard& x : sh) over_tokens(s.tokens, {{"vocab", x.vocab()}, {"hidden", x.m->hidden}});
  } else {
    op_grid(op);  // unknown op: Error listing the known ones
    throw Error(ErrorCode::internal, "perfdb: no grid rule for known op '" + op + "'");
  }
  return pts;
}

}  // namespace

GridCap default_cap(DeviceKind device, double copy_gbps, double gemm_gflops) {
  GridCap c;
  c.copy_gbps = copy_gbps;
  c.gemm_gflops = gemm_gflops;
  if (device == DeviceKind::cpu) {
    c.max_seconds = 2.0;
    c.keep_tokens = {128, 512};
    c.keep_max_seconds = 10.0;
    c.max_bytes = 1.5 * double(int64_t(1) << 30);
  } else {
    c.max_bytes = 8.0 * double(int64_t(1) << 30);
  }
  return c;
}

std::vector<Dims> grid_points(const std::string& op, const std::string& grid, DeviceKind device,
                              const GridCap& cap, const std::string& dtype) {
  const OpGrid& g = op_grid(op);
  GridSpec spec = spec_for(grid, device);
  if (!cap.only_models.empty()) {
    std::vector<const Model*> keep;
    for (const std::string& name : cap.only_models) {
      const Model* found = nullptr;
      for (const Model* m : all_models())
        if (name == m->name) found = m;
      if (!found) {
        std::string names;
        for (const Model* m : all_models()) names += (names.empty() ? "" : ", ") + std::string(m->name);
        throw Error(ErrorCode::unknown_name, "collect: unknown model '" + name + "' (grid models: " + names + ")");
      }
      if (std::find(spec.models.begin(), spec.models.end(), found) != spec.models.end()) keep.push_back(found);
    }
    spec.models = keep;
  }
  if (!cap.only_tp.empty()) {
    std::vector<int64_t> keep;
    for (int64_t tp : spec.tp)
      if (std::count(cap.only_tp.begin(), cap.only_tp.end(), tp)) keep.push_back(tp);
    spec.tp = keep;
  }
  std::vector<Dims> pts = raw_points(op, spec);
  auto key = [&](const Dims& d) {
    std::vector<int64_t> k;
    for (const std::string& n : g.dims) k.push_back(d.at(n));
    return k;
  };
  std::sort(pts.begin(), pts.end(), [&](const Dims& a, const Dims& b) { return key(a) < key(b); });
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  std::vector<Dims> kept;
  for (const Dims& d : pts) {
    bool in_range = true;
    for (const auto& [name, range] : cap.only_ranges)
      if (auto it = d.find(name); it != d.end())
        in_range = in_range && it->second >= range.first && it->second <= range.second;
    if (!in_range) continue;
    if (cap.max_bytes > 0 && footprint_bytes(op, dtype, d) > cap.max_bytes) continue;
    if (cap.max_seconds > 0) {
      const Cost c = cost_at(op, dtype, d);
      const double t = std::max(cap.copy_gbps > 0 ? c.bytes / (cap.copy_gbps * 1e9) : 0.0,
                                cap.gemm_gflops > 0 ? c.flops / (cap.gemm_gflops * 1e9) : 0.0);
      const bool keep = d.count("tokens") && std::count(cap.keep_tokens.begin(), cap.keep_tokens.end(), d.at("tokens"));
      if (t > (keep ? std::max(cap.max_seconds, cap.keep_max_seconds) : cap.max_seconds)) continue;
    }
    kept.push_back(d);
  }
  return kept;
}

}  // namespace opforge::perfdb
