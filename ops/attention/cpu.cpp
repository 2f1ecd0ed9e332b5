// CPU kernels of the attention family: attention_prefill_cpu, attention_decode_cpu (this file),
// attention_prefill_backward_cpu (cpu_backward.cpp); shared per-target building blocks in
// cpu-inl.h.
//
// Assumes: Note [attention layout] (unit-stride head_dim, uniform row strides), f32 / bf16 / f16
// (f64 goes to the reference kernel: the predicates say so), the op's check has run (so
// cu_seqlens and seq_lens are valid and every query row sees at least one key, Note [attention
// mask]).
//
// Why it is fast:
// - Flash-style tiling: the score matrix never exists. A prefill task owns one sequence, one kv
//   head and a block of query positions; its rows are (query position, query head of the group),
//   so the G = Hq / Hkv query heads of a GQA group share every K/V tile (read and widened once per
//   task, not once per head). Key tiles take a quarter of L2 and a task's f32 query rows and
//   accumulators about half (Note [tiling]).
// - Online softmax per row: running max and sum; a tile rescales the accumulator only when the
//   max grows. exp is Highway's vector Exp (1 ulp).
// - One Highway source, runtime dispatch. bf16/f16 rows are widened to f32 once (queries per
//   task, keys and values per tile) into rows padded to whole vectors with zeros, so dot products
//   and axpys have no tails; outputs are rounded once (Note [vector rounding]).
// - The G heads of a query position see the same keys, so they are computed together
//   (group_dots: 2 keys x 4 heads per pass, each query load feeds 2 FMAs and each key load 4;
//   group_weighted_sum: 4 heads x 2 vectors of accumulators stay in registers over the keys).
//   Groups of other sizes (MHA, G = 2) take one row at a time (dots: 4 keys per query load).
// - Causal and window masks only narrow each position's key range inside a tile: masked pairs
//   cost nothing and tiles outside a block's range are never loaded.
// - Decode (head_dim a whole number of vectors): a task is a sequence (or a range of its kv heads
//   when there are fewer sequences than threads). Cache rows are read straight from memory in
//   token order over all kv heads, so the cache streams through once, in runs of 8 tokens for the
//   score pass and again for the value pass; the G heads of a kv head share each row. Other
//   head_dims use the prefill task with one query position.
// - Backward recomputes p = exp(s - lse) (no stored probabilities). dk and dv: one task per
//   (sequence, kv head, key block) walks every query position that sees the block, the G heads of
//   a position in one pass (rows_weighted), so dk/dv need no cross-task reduction; dq: one task
//   per query block like the forward. No atomics: deterministic for any thread count.
//
// Roofline of decode: with G query heads per kv head, each bf16 cache byte carries G flops (2G
// per element for q.k and 2G for p.v over 2 bytes each of K and V), so at G = 4 a 2-core AVX2
// machine copying ~20 GB/s needs ~80 GFLOP/s to be memory-bound: decode sits at the ridge and is
// bound by FMA and load issue, not by memory, on such hosts (G = 1 would be memory-bound).
//
// Measured (2-core AMD EPYC VM, AVX2 target, shared with other jobs: load average 13-16 on its 2
// cores during the runs; 2026-11-26). `opforge bench --group large --dtype bf16 --no-reference`,
// copy ceiling 2.9 GB/s in the same run: decode h32/kv8/d128, context 2048, batch 8 / 32 / 16
// (mixed lengths): 17% / 21% / 14% of copy; prefill 2 x 512 tokens causal h32/kv8/d128 at 3.3
// GFLOP/s, backward 2.4 GFLOP/s (wall clock, so mostly the share of the cores it got). Process
// CPU time of one thread, which the sharing does not dilute: prefill 21 GFLOP/s, backward 15
// GFLOP/s (10 flops per pair and dim), decode 3.5 GB/s of cache read while memcpy of the same
// bytes reaches 18-20 GB/s (read + written) per core, i.e. ~18% of copy: the FMA/load-bound
// regime the roofline above predicts for G = 4 on AVX2.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "ops/attention/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::attention_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// Cache rows are read straight from memory (head_dim must be a whole number of vectors here;
// the driver sends other sizes to forward_task). Rows r = head - kv_head * G, keys in tiles of
// t.key_block with a score row of the tile per query head.
template <class T> void decode_task_typed(const AttentionRows& a, const AttentionTask& t) {
  const int64_t dp = a.head_dim, G = a.group;
  const int64_t heads = t.kv_head_end - t.kv_head, rows = heads * G, tile = t.key_block;
  Scratch& w = scratch();
  float* q = sized(w.rows_a, rows * dp);
  float* acc = sized(w.rows_b, rows * dp);
  float* s = sized(w.s, rows * tile);
  if (int64_t(w.state.size()) < rows) w.state.resize(size_t(rows));
  const int64_t i = t.end - 1;  // the query position
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = (t.q_token0 + i) * a.q_heads + t.kv_head * G + r;
    widen_row(row_ptr<T>(a.q, row, a.q_stride), a.head_dim, dp, a.scale, q + r * dp);
    std::fill(acc + r * dp, acc + (r + 1) * dp, 0.0f);
    w.state[size_t(r)] = RowState{};
  }
  for (int64_t j0 = 0; j0 < t.n_keys; j0 += tile) {
    const int64_t n = std::min(tile, t.n_keys - j0);
    // Key rows in runs of kValueRun tokens over all heads (in memory order, as the values).
    for (int64_t jr = j0; jr < j0 + n; jr += kValueRun)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = (t.k_token0 + jr) * a.kv_heads + t.kv_head + h;
        group_dots(q + h * G * dp, G, dp, row_ptr<T>(a.k, row, a.k_stride), a.kv_heads * a.k_stride,
                   std::min(kValueRun, j0 + n - jr), s + h * G * tile + (jr - j0), tile);
      }
    for (int64_t r = 0; r < rows; ++r) online_scale(s + r * tile, n, dp, w.state[size_t(r)], acc + r * dp);
    // Value rows in runs of kValueRun tokens over all heads: memory is walked in order (a run
    // is contiguous) while each accumulator is loaded and stored once per run, not per key.
    for (int64_t jr = j0; jr < j0 + n; jr += kValueRun)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = (t.k_token0 + jr) * a.kv_heads + t.kv_head + h;
        group_weighted_sum(s + h * G * tile + (jr - j0), tile, std::min(kValueRun, j0 + n - jr), G,
                           row_ptr<T>(a.v, row, a.v_stride), a.kv_heads * a.v_stride, dp,
                           acc + h * G * dp);
      }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const RowState& st = w.state[size_t(r)];
    const int64_t row = (t.q_token0 + i) * a.q_heads + t.kv_head * G + r;
    narrow_row(acc + r * dp, a.head_dim, st.sum > 0 ? 1.0f / st.sum : 0.0f,
               row_ptr_mut<T>(a.out, row, a.out_stride));
  }
}

void decode_task(const AttentionRows& a, const AttentionTask& t) {
  switch (a.dtype) {
    case DType::bf16: return decode_task_typed<bf16_t>(a, t);
    case DType::f16: return decode_task_typed<f16_t>(a, t);
    default: return decode_task_typed<float>(a, t);
  }
}

// Forward (and decode) task: rows r = (i - begin) * G + g.
template <class T> void forward_task_typed(const AttentionRows& a, const AttentionTask& t) {
  const int64_t dp = padded(a.head_dim), G = a.group, rows = (t.end - t.begin) * G;
  Scratch& w = scratch();
  float* q = sized(w.rows_a, rows * dp);
  float* acc = sized(w.rows_b, rows * dp);
  if (int64_t(w.state.size()) < rows) w.state.resize(size_t(rows));
  for (int64_t i = t.begin; i < t.end; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (i - t.begin) * G + g;
      widen_row(row_ptr<T>(a.q, q_row_of(a, t, i, g), a.q_stride), a.head_dim, dp, a.scale, q + r * dp);
      std::fill(acc + r * dp, acc + (r + 1) * dp, 0.0f);
      w.state[size_t(r)] = RowState{};
    }
  float* k_tile = sized(w.tile_k, t.key_block * dp);
  float* v_tile = sized(w.tile_v, t.key_block * dp);
  float* s = sized(w.s, G * t.key_block);
  const int64_t k_begin = attention_key_begin(t.begin, t.window_left);
  const int64_t k_end = attention_key_end(t.end - 1, t.n_keys, t.causal);
  for (int64_t j0 = k_begin; j0 < k_end; j0 += t.key_block) {
    const int64_t j1 = std::min(k_end, j0 + t.key_block);
    load_tile<T>(a, t, j0, j1, dp, k_tile, v_tile);
    for (int64_t i = t.begin; i < t.end; ++i) {
      const int64_t lo = std::max(j0, attention_key_begin(i, t.window_left));
      const int64_t hi = std::min(j1, attention_key_end(i, t.n_keys, t.causal));
      if (lo >= hi) continue;
      const int64_t r0 = (i - t.begin) * G, off = (lo - j0) * dp;
      if (G % 4 == 0) {  // the G heads of position i share the key range: 2 keys x 4 heads
        group_dots(q + r0 * dp, G, dp, k_tile + off, dp, hi - lo, s, t.key_block);
        for (int64_t g = 0; g < G; ++g)
          online_scale(s + g * t.key_block, hi - lo, dp, w.state[size_t(r0 + g)], acc + (r0 + g) * dp);
        group_weighted_sum(s, t.key_block, hi - lo, G, v_tile + off, dp, dp, acc + r0 * dp);
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        dots(q + (r0 + g) * dp, k_tile + off, hi - lo, dp, s);
        online_update(s, hi - lo, v_tile + off, dp, w.state[size_t(r0 + g)], acc + (r0 + g) * dp);
      }
    }
  }
  for (int64_t i = t.begin; i < t.end; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (i - t.begin) * G + g;
      const RowState& st = w.state[size_t(r)];
      const int64_t row = q_row_of(a, t, i, g);
      // A row without keys (decode of an empty sequence) gives 0.
      narrow_row(acc + r * dp, a.head_dim, st.sum > 0 ? 1.0f / st.sum : 0.0f,
                 row_ptr_mut<T>(a.out, row, a.out_stride));
      if (t.lse_token0 >= 0)
        a.lse[(t.kv_head * G + g) * a.tokens + t.lse_token0 + i] = st.max + std::log(st.sum);
    }
}

void forward_task(const AttentionRows& a, const AttentionTask& t) {
  switch (a.dtype) {
    case DType::bf16: return forward_task_typed<bf16_t>(a, t);
    case DType::f16: return forward_task_typed<f16_t>(a, t);
    default: return forward_task_typed<float>(a, t);
  }
}

// Lanes of the dispatched target (the decode driver's choice of path depends on it).
int64_t vector_lanes() { return lanes(); }

}  // namespace opforge::attention_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge {
namespace attention_cpu {
HWY_EXPORT(forward_task);
HWY_EXPORT(decode_task);
HWY_EXPORT(vector_lanes);
}  // namespace attention_cpu

AttentionRows attention_rows_of(const TensorView& q, const TensorView& k, const TensorView& v,
                      double softmax_scale) {
  AttentionRows a;
  a.dtype = q.dtype;
  a.head_dim = q.size(-1);
  a.q_heads = q.size(-2);
  a.kv_heads = k.size(-2);
  a.group = a.q_heads / a.kv_heads;
  a.scale = float(attention_scale(softmax_scale, a.head_dim));
  a.q = q.data;
  a.q_stride = q.row_stride();
  a.k = k.data;
  a.k_stride = k.row_stride();
  a.v = v.data;
  a.v_stride = v.row_stride();
  return a;
}

// Note [tiling]: `tensors` f32 rows of head_dim per unit, in the given cache level.
int64_t attention_block(int64_t tensors, int64_t head_dim, cpu::CacheLevel level) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors * int64_t(sizeof(float));
  spec.multiplier = head_dim;
  spec.level = level;
  return cpu::capacity_block(spec);
}

// Keys per tile of the forward and dq tasks: the widened K and V rows of a tile take a quarter
// of L2 (the task's query rows take about half), so every query row of the task re-reads the
// tile from L2; larger tiles amortise the per-tile softmax bookkeeping (max, rescale, exp).
int64_t attention_key_tile(int64_t head_dim) { return attention_block(4, head_dim, cpu::CacheLevel::l2); }

// Tasks over (sequence, kv head, block of positions) of a packed batch.
std::vector<AttentionTask> attention_prefill_tasks(const std::vector<int64_t>& cu, int64_t kv_heads,
                                         int64_t block, int64_t key_block, bool causal,
                                         int64_t window_left) {
  std::vector<AttentionTask> tasks;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t n = cu[b + 1] - cu[b];
    for (int64_t kv_head = 0; kv_head < kv_heads; ++kv_head)
      for (int64_t begin = 0; begin < n; begin += block) {
        AttentionTask t;
        t.q_token0 = t.k_token0 = t.lse_token0 = cu[b];
        t.n_keys = n;
        t.kv_head = kv_head;
        t.begin = begin;
        t.end = std::min(n, begin + block);
        t.causal = causal;
        t.window_left = window_left;
        t.key_block = key_block;
        tasks.push_back(t);
      }
  }
  return tasks;
}


const char* attention_cpu_dtype_reason(const TensorView& q) {
  if (!q.device.is_cpu()) return "tensors are not on the cpu";
  switch (q.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}



void attention_prefill_cpu(const Context&, const TensorView& out, const TensorView& lse,
                           const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& cu_seqlens, bool causal, double softmax_scale,
                           int64_t window_left) {
  if (q.numel() == 0) return;
  AttentionRows a = attention_rows_of(q, k, v, softmax_scale);
  a.out = out.data;
  a.out_stride = out.row_stride();
  a.lse = static_cast<float*>(lse.data);
  a.tokens = q.size(0);
  // Query positions per task: the f32 query rows and accumulators of the group in half of L2.
  const int64_t block = attention_block(2 * a.group, a.head_dim, cpu::CacheLevel::l2);
  const auto tasks = attention_prefill_tasks(index_values(cu_seqlens), a.kv_heads, block,
                                   attention_key_tile(a.head_dim), causal, window_left);
  run_attention_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::forward_task));
}

void attention_decode_cpu(const Context&, const TensorView& out, const TensorView& q,
                          const TensorView& k_cache, const TensorView& v_cache,
                          const TensorView& seq_lens, double softmax_scale) {
  if (q.numel() == 0) return;
  AttentionRows a = attention_rows_of(q, k_cache, v_cache, softmax_scale);
  a.out = out.data;
  a.out_stride = out.row_stride();
  const int64_t max_ctx = k_cache.size(1), batch = q.size(0);
  const std::vector<int64_t> lens = index_values(seq_lens);
  // Cache rows straight from memory when head_dim is whole vectors: the tokens of a sequence are
  // walked in order over all kv heads of the task, so the cache streams through once. Tasks are
  // sequences, cut into kv-head ranges only when there are fewer sequences than threads.
  const bool direct = a.head_dim % HWY_DYNAMIC_DISPATCH(attention_cpu::vector_lanes)() == 0;
  const int64_t threads = cpu::cpu_info().threads;
  const int64_t kv_parts = direct ? std::min(a.kv_heads, cpu::ceil_div(threads, batch)) : a.kv_heads;
  const int64_t kv_per_task = cpu::ceil_div(a.kv_heads, kv_parts);
  // Keys per tile: one f32 score per (query head of the task, key) in half of L1.
  const int64_t key_block = direct ? cpu::capacity_block({int64_t(sizeof(float)) * kv_per_task * a.group, 1,
                                                          cpu::CacheLevel::l1d})
                                   : attention_key_tile(a.head_dim);
  // One query at position n - 1 of each sequence, seeing keys [0, n) (causal).
  std::vector<AttentionTask> tasks;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t kv_head = 0; kv_head < a.kv_heads; kv_head += kv_per_task) {
      const int64_t n = lens[size_t(b)];
      AttentionTask t;
      t.q_token0 = b - (n - 1);
      t.k_token0 = b * max_ctx;
      t.n_keys = n;
      t.kv_head = kv_head;
      t.kv_head_end = std::min(a.kv_heads, kv_head + kv_per_task);
      t.begin = n - 1;
      t.end = n;
      t.key_block = key_block;
      tasks.push_back(t);
    }
  if (direct) return run_attention_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::decode_task));
  run_attention_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::forward_task));
}

const char* attention_prefill_cpu_applicable(const TensorView&, const TensorView&,
                                             const TensorView& q, const TensorView&,
                                             const TensorView&, const TensorView&, bool, double,
                                             int64_t) {
  return attention_cpu_dtype_reason(q);
}
const char* attention_decode_cpu_applicable(const TensorView&, const TensorView& q,
                                            const TensorView&, const TensorView&,
                                            const TensorView&, double) {
  return attention_cpu_dtype_reason(q);
}

}  // namespace opforge
#endif  // HWY_ONCE
