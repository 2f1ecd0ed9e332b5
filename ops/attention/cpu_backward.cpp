// CPU kernel of attention_prefill_backward (ops/attention/attention.h); the building blocks are
// in cpu-inl.h, the forward in cpu.cpp (whose header comment covers the common design).
//
// Assumes: as cpu.cpp; lse f32 [Hq, T] as the forward writes it.
//
// Why it is fast: p = exp(scale q.k - lse) is recomputed (no stored probabilities), in two
// passes that both read K/V as f32 tiles shared by the G heads of a GQA group:
// - dk, dv: one task per (sequence, kv head, key block) walks every query position that sees
//   the block; the G heads of a position update the block's f32 dk / dv rows in one pass
//   (rows_weighted), so no reduction across tasks is needed;
// - dq: one task per (sequence, kv head, query block) like the forward (group_dots for q.k and
//   dout.v, group_weighted_sum for ds.k).
// delta = dout . out is computed first, per token block. No atomics: deterministic for any
// thread count. Key blocks and query blocks from capacity_block (Note [tiling]).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/cpu_backward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "ops/attention/cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::attention_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// delta[h * T + token] = dout . out for tokens [begin, end), every head.
template <class T>
void delta_rows_typed(const AttentionRows& a, const void* out, int64_t out_stride, float* delta,
                      int64_t begin, int64_t end) {
  for (int64_t token = begin; token < end; ++token)
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const int64_t row = token * a.q_heads + h;
      const T* x = row_ptr<T>(a.dout, row, a.dout_stride);
      const T* y = row_ptr<T>(out, row, out_stride);
      delta[h * a.tokens + token] = sum_over(a.head_dim, [&](int64_t i, size_t count, VF& acc) {
        acc = hn::MulAdd(load_n(x + i, count), load_n(y + i, count), acc);
      });
    }
}

void delta_rows(const AttentionRows& a, const void* out, int64_t out_stride, float* delta,
                int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return delta_rows_typed<bf16_t>(a, out, out_stride, delta, begin, end);
    case DType::f16: return delta_rows_typed<f16_t>(a, out, out_stride, delta, begin, end);
    default: return delta_rows_typed<float>(a, out, out_stride, delta, begin, end);
  }
}

// For the G query rows of one position (q, dout: G rows dp apart) and n keys (tile rows dp
// apart): p[g * stride + j] = exp(scale * q_g . k_j - lse_g) and
// ds[g * stride + j] = scale * p * (dout_g . v_j - delta_g). lse_g, delta_g are `step` apart.
void group_probabilities(const AttentionRows& a, const float* q, const float* dout, const float* k_rows,
                         const float* v_rows, int64_t n, int64_t dp, const float* lse,
                         const float* delta, int64_t step, float* p, float* ds, int64_t stride) {
  const int64_t G = a.group;
  group_dots(q, G, dp, k_rows, dp, n, p, stride);
  group_dots(dout, G, dp, v_rows, dp, n, ds, stride);
  for (int64_t g = 0; g < G; ++g) {
    float* pg = p + g * stride;
    float* dg = ds + g * stride;
    exp_in_place(pg, n, a.scale, lse[g * step]);
    const float d = delta[g * step];
    for (int64_t j = 0; j < n; ++j) dg[j] = a.scale * pg[j] * (dg[j] - d);
  }
}

// acc_j += sum_g w[g * stride + j] * x_g for the n accumulator rows j (dp apart) and the G rows x
// (dp apart): dk and dv of a key tile take the G heads of a query position in one pass.
void rows_weighted(const float* w, int64_t stride, int64_t G, const float* x, int64_t n, int64_t dp,
                   float* acc) {
  const int64_t L = lanes();
  for (int64_t j = 0; j < n; ++j) {
    float* c = acc + j * dp;
    int64_t i = 0;
    for (; i + 2 * L <= dp; i += 2 * L) {
      VF a0 = load(c + i), a1 = load(c + i + L);
      for (int64_t g = 0; g < G; ++g) {
        const VF wg = hn::Set(DF(), w[g * stride + j]);
        a0 = hn::MulAdd(wg, load(x + g * dp + i), a0);
        a1 = hn::MulAdd(wg, load(x + g * dp + i + L), a1);
      }
      store(a0, c + i);
      store(a1, c + i + L);
    }
    for (; i < dp; i += L) {
      VF a0 = load(c + i);
      for (int64_t g = 0; g < G; ++g) a0 = hn::MulAdd(hn::Set(DF(), w[g * stride + j]), load(x + g * dp + i), a0);
      store(a0, c + i);
    }
  }
}

// dk, dv task: keys [begin, end) of one kv head; every query position seeing them, with the G
// heads of the position together.
template <class T> void dkdv_task_typed(const AttentionRows& a, const AttentionTask& t) {
  const int64_t dp = padded(a.head_dim), nk = t.end - t.begin, G = a.group;
  Scratch& w = scratch();
  float* k_tile = sized(w.tile_k, nk * dp);
  float* v_tile = sized(w.tile_v, nk * dp);
  float* dk = sized(w.tile_dk, nk * dp);
  float* dv = sized(w.tile_dv, nk * dp);
  float* q = sized(w.rows_a, G * dp);
  float* dout = sized(w.rows_b, G * dp);
  float* p = sized(w.s, G * nk);
  float* ds = sized(w.s2, G * nk);
  load_tile<T>(a, t, t.begin, t.end, dp, k_tile, v_tile);
  std::fill(dk, dk + nk * dp, 0.0f);
  std::fill(dv, dv + nk * dp, 0.0f);
  const int64_t i_begin = t.causal ? t.begin : 0;
  const int64_t i_end = t.window_left < 0 ? t.n_keys : std::min(t.n_keys, t.end + t.window_left);
  for (int64_t i = i_begin; i < i_end; ++i) {
    const int64_t lo = std::max(t.begin, attention_key_begin(i, t.window_left));
    const int64_t hi = std::min(t.end, attention_key_end(i, t.n_keys, t.causal));
    if (lo >= hi) continue;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = q_row_of(a, t, i, g);
      widen_row(row_ptr<T>(a.q, row, a.q_stride), a.head_dim, dp, 1.0f, q + g * dp);
      widen_row(row_ptr<T>(a.dout, row, a.dout_stride), a.head_dim, dp, 1.0f, dout + g * dp);
    }
    const int64_t col = t.kv_head * G * a.tokens + t.lse_token0 + i, off = (lo - t.begin) * dp;
    group_probabilities(a, q, dout, k_tile + off, v_tile + off, hi - lo, dp, a.lse + col,
                        a.delta + col, a.tokens, p, ds, nk);
    rows_weighted(p, nk, G, dout, hi - lo, dp, dv + off);
    rows_weighted(ds, nk, G, q, hi - lo, dp, dk + off);
  }
  for (int64_t j = t.begin; j < t.end; ++j) {
    const int64_t row = (t.k_token0 + j) * a.kv_heads + t.kv_head;
    narrow_row(dk + (j - t.begin) * dp, a.head_dim, 1.0f, row_ptr_mut<T>(a.dk, row, a.dk_stride));
    narrow_row(dv + (j - t.begin) * dp, a.head_dim, 1.0f, row_ptr_mut<T>(a.dv, row, a.dv_stride));
  }
}

// dq task: query positions [begin, end) of the heads of one kv head (a.out is dq).
template <class T> void dq_task_typed(const AttentionRows& a, const AttentionTask& t) {
  const int64_t dp = padded(a.head_dim), G = a.group, rows = (t.end - t.begin) * G;
  Scratch& w = scratch();
  float* q = sized(w.rows_a, rows * dp);
  float* dout = sized(w.rows_b, rows * dp);
  float* dq = sized(w.rows_c, rows * dp);
  for (int64_t i = t.begin; i < t.end; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (i - t.begin) * G + g, row = q_row_of(a, t, i, g);
      widen_row(row_ptr<T>(a.q, row, a.q_stride), a.head_dim, dp, 1.0f, q + r * dp);
      widen_row(row_ptr<T>(a.dout, row, a.dout_stride), a.head_dim, dp, 1.0f, dout + r * dp);
      std::fill(dq + r * dp, dq + (r + 1) * dp, 0.0f);
    }
  float* k_tile = sized(w.tile_k, t.key_block * dp);
  float* v_tile = sized(w.tile_v, t.key_block * dp);
  float* p = sized(w.s, G * t.key_block);
  float* ds = sized(w.s2, G * t.key_block);
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
      const int64_t col = t.kv_head * G * a.tokens + t.lse_token0 + i;
      group_probabilities(a, q + r0 * dp, dout + r0 * dp, k_tile + off, v_tile + off, hi - lo, dp,
                          a.lse + col, a.delta + col, a.tokens, p, ds, t.key_block);
      group_weighted_sum(ds, t.key_block, hi - lo, G, k_tile + off, dp, dp, dq + r0 * dp);
    }
  }
  for (int64_t i = t.begin; i < t.end; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (i - t.begin) * G + g;
      narrow_row(dq + r * dp, a.head_dim, 1.0f, row_ptr_mut<T>(a.out, q_row_of(a, t, i, g), a.out_stride));
    }
}

void dkdv_task(const AttentionRows& a, const AttentionTask& t) {
  switch (a.dtype) {
    case DType::bf16: return dkdv_task_typed<bf16_t>(a, t);
    case DType::f16: return dkdv_task_typed<f16_t>(a, t);
    default: return dkdv_task_typed<float>(a, t);
  }
}

void dq_task(const AttentionRows& a, const AttentionTask& t) {
  switch (a.dtype) {
    case DType::bf16: return dq_task_typed<bf16_t>(a, t);
    case DType::f16: return dq_task_typed<f16_t>(a, t);
    default: return dq_task_typed<float>(a, t);
  }
}

}  // namespace opforge::attention_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge {
namespace attention_cpu {
HWY_EXPORT(delta_rows);
HWY_EXPORT(dkdv_task);
HWY_EXPORT(dq_task);
}  // namespace attention_cpu

void attention_prefill_backward_cpu(const Context&, const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv, const TensorView& dout,
                                    const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& cu_seqlens, bool causal,
                                    double softmax_scale, int64_t window_left) {
  if (q.numel() == 0) return;
  AttentionRows a = attention_rows_of(q, k, v, softmax_scale);
  a.tokens = q.size(0);
  a.lse = const_cast<float*>(static_cast<const float*>(lse.data));
  a.dout = dout.data;
  a.dout_stride = dout.row_stride();
  a.dk = dk.data;
  a.dk_stride = dk.row_stride();
  a.dv = dv.data;
  a.dv_stride = dv.row_stride();
  a.out = dq.data;
  a.out_stride = dq.row_stride();
  // delta = dout . out per query row, in token blocks that fit half of L2.
  std::vector<float> delta(size_t(a.q_heads * a.tokens));
  a.delta = delta.data();
  const cpu::RowTasks token_tasks{a.tokens, attention_block(2 * a.q_heads, a.head_dim, cpu::CacheLevel::l2)};
  auto* delta_fn = HWY_DYNAMIC_DISPATCH(attention_cpu::delta_rows);
  cpu::parallel_tasks(token_tasks.count(), [&](int64_t t) {
    delta_fn(a, out.data, out.row_stride(), delta.data(), token_tasks.begin(t), token_tasks.end(t));
  });
  const std::vector<int64_t> cu = index_values(cu_seqlens);
  // dk, dv: key blocks whose widened K, V and f32 dk, dv rows fit half of L2.
  const int64_t key_block = attention_block(4, a.head_dim, cpu::CacheLevel::l2);
  run_attention_tasks(attention_prefill_tasks(cu, a.kv_heads, key_block, key_block, causal, window_left), a,
            HWY_DYNAMIC_DISPATCH(attention_cpu::dkdv_task));
  // dq: query blocks whose q, dout and dq rows (f32, the whole group) fit half of L2.
  const int64_t block = attention_block(3 * a.group, a.head_dim, cpu::CacheLevel::l2);
  run_attention_tasks(attention_prefill_tasks(cu, a.kv_heads, block, attention_key_tile(a.head_dim), causal, window_left), a,
            HWY_DYNAMIC_DISPATCH(attention_cpu::dq_task));
}

const char* attention_prefill_backward_cpu_applicable(
    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
    const TensorView& q, const TensorView&, const TensorView&, const TensorView&,
    const TensorView&, const TensorView&, bool, double, int64_t) {
  return attention_cpu_dtype_reason(q);
}

}  // namespace opforge
#endif  // HWY_ONCE
