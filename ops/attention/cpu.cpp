// CPU kernels of the attention family: attention_prefill_cpu, attention_decode_cpu,
// attention_prefill_backward_cpu.
//
// Assumes: Note [attention layout] (unit-stride head_dim, uniform row strides), f32 / bf16 / f16
// (f64 goes to the reference kernel: the predicates say so), the op's check has run (so
// cu_seqlens and seq_lens are valid and every query row sees at least one key, Note [attention
// mask]).
//
// Why it is fast:
// - Flash-style tiling: the score matrix never exists. A task owns one sequence, one kv head and
//   a block of query positions; its rows are (query position, query head of the group), so the
//   G = Hq / Hkv query heads of a GQA group share every K/V tile (read and widened once per task,
//   not once per head). Keys come in tiles of a quarter of L2 (Note [tiling]); query blocks are sized so
//   the f32 query rows and accumulators of a task fit half of L2.
// - Online softmax per row: running max m and sum l; a new tile rescales the accumulator only
//   when the max grows. exp is Highway's vector Exp (1 ulp).
// - One Highway source, runtime dispatch. bf16/f16 rows are widened to f32 once (queries per
//   task, keys and values per tile) into rows padded to whole vectors with zeros, so dot products
//   and axpys have no tails; outputs are rounded once (Note [vector rounding]).
// - Scores are dot products of one query row with 4 keys at a time (4 accumulators, one query
//   load per 4 FMAs); the weighted sum keeps 4 accumulator vectors of the output row in
//   registers while it walks the tile's values.
// - Causal and window masks only narrow each row's key range inside a tile: masked pairs cost
//   nothing and tiles entirely outside a block's range are never loaded.
// - Decode is the same task with one query position (the last) and the G heads of a kv head:
//   each cache row is read from memory once per kv head.
// - Backward recomputes p = exp(s - lse) (no stored probabilities). dk and dv: one task per
//   (sequence, kv head, key block) walks every query that sees the block, over all heads of the
//   group, so dk/dv need no cross-task reduction; dq: one task per query block like the forward.
//   No atomics: deterministic and independent of the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/attention/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::attention_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

inline int64_t lanes() { return int64_t(hn::Lanes(DF())); }
// head_dim rounded up to whole vectors: the length of every f32 row a task keeps.
inline int64_t padded(int64_t dim) { return (dim + lanes() - 1) / lanes() * lanes(); }

// dst[0, dp) = mul * src[0, dim) in f32, zero past dim.
template <class T> void widen_row(const T* src, int64_t dim, int64_t dp, float mul, float* dst) {
  const VF vm = hn::Set(DF(), mul);
  for (int64_t i = 0; i < dp; i += lanes()) {
    const int64_t count = std::min(lanes(), dim - i);
    const VF v = count > 0 ? load_n(src + i, size_t(count)) : hn::Zero(DF());
    store(hn::Mul(v, vm), dst + i);
  }
}

// dst[0, dim) = mul * src[0, dim), rounded to T.
template <class T> void narrow_row(const float* src, int64_t dim, float mul, T* dst) {
  const VF vm = hn::Set(DF(), mul);
  for_each_vector(dim, [&](int64_t i, size_t count) { store_n(hn::Mul(load(src + i), vm), dst + i, count); });
}

HWY_INLINE float dot(const float* a, const float* b, int64_t dp) {
  VF s = hn::Zero(DF());
  for (int64_t i = 0; i < dp; i += lanes()) s = hn::MulAdd(load(a + i), load(b + i), s);
  return sum_lanes(s);
}

// s[j] = q . keys[j] for j in [0, n); key rows dp apart.
void dots(const float* q, const float* keys, int64_t n, int64_t dp, float* s) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* k0 = keys + j * dp;
    VF a0 = hn::Zero(DF()), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < dp; i += lanes()) {
      const VF qv = load(q + i);
      a0 = hn::MulAdd(qv, load(k0 + i), a0);
      a1 = hn::MulAdd(qv, load(k0 + dp + i), a1);
      a2 = hn::MulAdd(qv, load(k0 + 2 * dp + i), a2);
      a3 = hn::MulAdd(qv, load(k0 + 3 * dp + i), a3);
    }
    s[j] = sum_lanes(a0);
    s[j + 1] = sum_lanes(a1);
    s[j + 2] = sum_lanes(a2);
    s[j + 3] = sum_lanes(a3);
  }
  for (; j < n; ++j) s[j] = dot(q, keys + j * dp, dp);
}

// acc[0, dp) += sum_j w[j] * rows[j] for j in [0, n); rows dp apart.
void weighted_sum(const float* w, const float* rows, int64_t n, int64_t dp, float* acc) {
  const int64_t L = lanes();
  int64_t i = 0;
  for (; i + 4 * L <= dp; i += 4 * L) {
    VF a0 = load(acc + i), a1 = load(acc + i + L), a2 = load(acc + i + 2 * L), a3 = load(acc + i + 3 * L);
    for (int64_t j = 0; j < n; ++j) {
      const VF wj = hn::Set(DF(), w[j]);
      const float* r = rows + j * dp + i;
      a0 = hn::MulAdd(wj, load(r), a0);
      a1 = hn::MulAdd(wj, load(r + L), a1);
      a2 = hn::MulAdd(wj, load(r + 2 * L), a2);
      a3 = hn::MulAdd(wj, load(r + 3 * L), a3);
    }
    store(a0, acc + i);
    store(a1, acc + i + L);
    store(a2, acc + i + 2 * L);
    store(a3, acc + i + 3 * L);
  }
  for (; i < dp; i += L) {
    VF a = load(acc + i);
    for (int64_t j = 0; j < n; ++j) a = hn::MulAdd(hn::Set(DF(), w[j]), load(rows + j * dp + i), a);
    store(a, acc + i);
  }
}

// s[j] = exp(s[j] * mul - sub) for j in [0, n); returns their sum.
float exp_in_place(float* s, int64_t n, float mul, float sub) {
  const DF d;
  const VF vm = hn::Set(d, mul), vs = hn::Set(d, sub);
  VF sum = hn::Zero(d);
  int64_t j = 0;
  for (; j + lanes() <= n; j += lanes()) {
    const VF p = hn::Exp(d, hn::MulSub(load(s + j), vm, vs));
    store(p, s + j);
    sum = hn::Add(sum, p);
  }
  float total = sum_lanes(sum);
  for (; j < n; ++j) total += (s[j] = std::exp(s[j] * mul - sub));
  return total;
}

// Online softmax state of one query row (Note [attention mask] guarantees a key per row).
struct RowState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0;
};

// Folds n scores s (scaled; overwritten by their exp) and their value rows into a row's state.
void online_update(float* s, int64_t n, const float* values, int64_t dp, RowState& st, float* acc) {
  float tile_max = s[0];
  for (int64_t j = 1; j < n; ++j) tile_max = std::max(tile_max, s[j]);
  const float new_max = std::max(st.max, tile_max);
  if (new_max > st.max && st.sum > 0) {  // rescale what earlier tiles accumulated
    const float alpha = std::exp(st.max - new_max);
    st.sum *= alpha;
    const VF va = hn::Set(DF(), alpha);
    for (int64_t i = 0; i < dp; i += lanes()) store(hn::Mul(load(acc + i), va), acc + i);
  }
  st.max = new_max;
  st.sum += exp_in_place(s, n, 1.0f, new_max);
  weighted_sum(s, values, n, dp, acc);
}

// Per-thread scratch, grown on demand and kept between tasks.
struct Scratch {
  std::vector<float> rows_a, rows_b, rows_c, tile_k, tile_v, tile_dk, tile_dv, s, s2;
  std::vector<RowState> state;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
float* sized(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

template <class T> const T* row_ptr(const void* base, int64_t row, int64_t stride) {
  return static_cast<const T*>(base) + row * stride;
}
template <class T> T* row_ptr_mut(void* base, int64_t row, int64_t stride) {
  return static_cast<T*>(base) + row * stride;
}

// Keys and values [j0, j1) of a task's kv head, widened into tile rows.
template <class T>
void load_tile(const AttentionRows& a, const AttentionTask& t, int64_t j0, int64_t j1, int64_t dp,
               float* k_tile, float* v_tile) {
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t row = (t.k_token0 + j) * a.kv_heads + t.kv_head;
    widen_row(row_ptr<T>(a.k, row, a.k_stride), a.head_dim, dp, 1.0f, k_tile + (j - j0) * dp);
    widen_row(row_ptr<T>(a.v, row, a.v_stride), a.head_dim, dp, 1.0f, v_tile + (j - j0) * dp);
  }
}

inline int64_t q_row_of(const AttentionRows& a, const AttentionTask& t, int64_t i, int64_t g) {
  return (t.q_token0 + i) * a.q_heads + t.kv_head * a.group + g;
}

// ---- decode: one query per sequence, every cache row read once ---------------------------------
// s[g * stride + j] = q_g . key_j for the G query rows q (dp apart) of one kv head and keys
// j in [0, n) (storage type, k_step elements apart). Two keys x four rows at a time: each query
// vector load feeds two FMAs, each widened key vector four.
template <class T>
void group_dots(const float* q, int64_t G, int64_t dp, const T* keys, int64_t k_step, int64_t n,
                float* s, int64_t stride) {
  int64_t g0 = 0;
  for (; g0 + 4 <= G; g0 += 4) {
    const float* q0 = q + g0 * dp;
    float* s0 = s + g0 * stride;
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const T* k0 = keys + j * k_step;
      const T* k1 = k0 + k_step;
      VF a0 = hn::Zero(DF()), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int64_t i = 0; i < dp; i += lanes()) {
        const VF x0 = load(k0 + i), x1 = load(k1 + i);
        VF qv = load(q0 + i);
        a0 = hn::MulAdd(qv, x0, a0);
        b0 = hn::MulAdd(qv, x1, b0);
        qv = load(q0 + dp + i);
        a1 = hn::MulAdd(qv, x0, a1);
        b1 = hn::MulAdd(qv, x1, b1);
        qv = load(q0 + 2 * dp + i);
        a2 = hn::MulAdd(qv, x0, a2);
        b2 = hn::MulAdd(qv, x1, b2);
        qv = load(q0 + 3 * dp + i);
        a3 = hn::MulAdd(qv, x0, a3);
        b3 = hn::MulAdd(qv, x1, b3);
      }
      s0[j] = sum_lanes(a0), s0[stride + j] = sum_lanes(a1);
      s0[2 * stride + j] = sum_lanes(a2), s0[3 * stride + j] = sum_lanes(a3);
      s0[j + 1] = sum_lanes(b0), s0[stride + j + 1] = sum_lanes(b1);
      s0[2 * stride + j + 1] = sum_lanes(b2), s0[3 * stride + j + 1] = sum_lanes(b3);
    }
    for (; j < n; ++j) {
      const T* k0 = keys + j * k_step;
      VF a0 = hn::Zero(DF()), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = 0; i < dp; i += lanes()) {
        const VF x = load(k0 + i);
        a0 = hn::MulAdd(load(q0 + i), x, a0);
        a1 = hn::MulAdd(load(q0 + dp + i), x, a1);
        a2 = hn::MulAdd(load(q0 + 2 * dp + i), x, a2);
        a3 = hn::MulAdd(load(q0 + 3 * dp + i), x, a3);
      }
      s0[j] = sum_lanes(a0), s0[stride + j] = sum_lanes(a1);
      s0[2 * stride + j] = sum_lanes(a2), s0[3 * stride + j] = sum_lanes(a3);
    }
  }
  for (; g0 < G; ++g0)
    for (int64_t j = 0; j < n; ++j) {
      VF a = hn::Zero(DF());
      for (int64_t i = 0; i < dp; i += lanes()) a = hn::MulAdd(load(q + g0 * dp + i), load(keys + j * k_step + i), a);
      s[g0 * stride + j] = sum_lanes(a);
    }
}

// acc_g += sum_j p[g * stride + j] * values[j] for the G accumulator rows (dp apart) of one kv
// head and n value rows (storage type, v_step elements apart). Accumulators stay in registers
// over the keys: 4 rows x 2 vectors at a time; each value vector is widened once per 4 rows.
template <class T>
void group_weighted_sum(const float* p, int64_t stride, int64_t n, int64_t G, const T* values,
                        int64_t v_step, int64_t dp, float* acc) {
  const int64_t L = lanes();
  int64_t g0 = 0;
  for (; g0 + 4 <= G; g0 += 4) {
    const float* p0 = p + g0 * stride;
    float* c = acc + g0 * dp;
    int64_t i = 0;
    for (; i + 2 * L <= dp; i += 2 * L) {
      VF a0 = load(c + i), a1 = load(c + dp + i), a2 = load(c + 2 * dp + i), a3 = load(c + 3 * dp + i);
      VF b0 = load(c + i + L), b1 = load(c + dp + i + L), b2 = load(c + 2 * dp + i + L),
         b3 = load(c + 3 * dp + i + L);
      for (int64_t j = 0; j < n; ++j) {
        const T* v = values + j * v_step + i;
        const VF x0 = load(v), x1 = load(v + L);
        VF w = hn::Set(DF(), p0[j]);
        a0 = hn::MulAdd(w, x0, a0);
        b0 = hn::MulAdd(w, x1, b0);
        w = hn::Set(DF(), p0[stride + j]);
        a1 = hn::MulAdd(w, x0, a1);
        b1 = hn::MulAdd(w, x1, b1);
        w = hn::Set(DF(), p0[2 * stride + j]);
        a2 = hn::MulAdd(w, x0, a2);
        b2 = hn::MulAdd(w, x1, b2);
        w = hn::Set(DF(), p0[3 * stride + j]);
        a3 = hn::MulAdd(w, x0, a3);
        b3 = hn::MulAdd(w, x1, b3);
      }
      store(a0, c + i), store(a1, c + dp + i), store(a2, c + 2 * dp + i), store(a3, c + 3 * dp + i);
      store(b0, c + i + L), store(b1, c + dp + i + L), store(b2, c + 2 * dp + i + L);
      store(b3, c + 3 * dp + i + L);
    }
    for (; i < dp; i += L) {
      VF a0 = load(c + i), a1 = load(c + dp + i), a2 = load(c + 2 * dp + i), a3 = load(c + 3 * dp + i);
      for (int64_t j = 0; j < n; ++j) {
        const VF x = load(values + j * v_step + i);
        a0 = hn::MulAdd(hn::Set(DF(), p0[j]), x, a0);
        a1 = hn::MulAdd(hn::Set(DF(), p0[stride + j]), x, a1);
        a2 = hn::MulAdd(hn::Set(DF(), p0[2 * stride + j]), x, a2);
        a3 = hn::MulAdd(hn::Set(DF(), p0[3 * stride + j]), x, a3);
      }
      store(a0, c + i), store(a1, c + dp + i), store(a2, c + 2 * dp + i), store(a3, c + 3 * dp + i);
    }
  }
  for (; g0 < G; ++g0)
    for (int64_t i = 0; i < dp; i += L) {
      VF a = load(acc + g0 * dp + i);
      for (int64_t j = 0; j < n; ++j)
        a = hn::MulAdd(hn::Set(DF(), p[g0 * stride + j]), load(values + j * v_step + i), a);
      store(a, acc + g0 * dp + i);
    }
}

// Softmax of one row's tile scores s[0, n) folded into its state; leaves p in s. Rescales acc.
void online_scale(float* s, int64_t n, int64_t dp, RowState& st, float* acc) {
  float tile_max = s[0];
  for (int64_t j = 1; j < n; ++j) tile_max = std::max(tile_max, s[j]);
  const float new_max = std::max(st.max, tile_max);
  if (new_max > st.max && st.sum > 0) {
    const float alpha = std::exp(st.max - new_max);
    st.sum *= alpha;
    const VF va = hn::Set(DF(), alpha);
    for (int64_t i = 0; i < dp; i += lanes()) store(hn::Mul(load(acc + i), va), acc + i);
  }
  st.max = new_max;
  st.sum += exp_in_place(s, n, 1.0f, new_max);
}

// Cache rows are read straight from memory (head_dim must be a whole number of vectors here;
// the driver sends other sizes to forward_task). Rows r = head - kv_head * G, keys in tiles of
// t.key_block with a score row of the tile per query head.
// Tokens per pass of group_weighted_sum in decode: a register-blocking factor (accumulator
// load/store amortised over 8 keys, an 8-deep chain of independent FMAs per accumulator), not a
// cache tile.
constexpr int64_t kValueRun = 8;

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

// Lanes of the dispatched target (the decode driver's choice of path depends on it).
int64_t vector_lanes() { return lanes(); }

}  // namespace opforge::attention_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace attention_cpu {
HWY_EXPORT(forward_task);
HWY_EXPORT(delta_rows);
HWY_EXPORT(dkdv_task);
HWY_EXPORT(dq_task);
HWY_EXPORT(decode_task);
HWY_EXPORT(vector_lanes);
}  // namespace attention_cpu

namespace {

AttentionRows rows_of(const TensorView& q, const TensorView& k, const TensorView& v,
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
int64_t block_of(int64_t tensors, int64_t head_dim, cpu::CacheLevel level) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors * int64_t(sizeof(float));
  spec.multiplier = head_dim;
  spec.level = level;
  return cpu::capacity_block(spec);
}

// Keys per tile of the forward and dq tasks: the widened K and V rows of a tile take a quarter
// of L2 (the task's query rows take about half), so every query row of the task re-reads the
// tile from L2; larger tiles amortise the per-tile softmax bookkeeping (max, rescale, exp).
int64_t key_tile(int64_t head_dim) { return block_of(4, head_dim, cpu::CacheLevel::l2); }

// Tasks over (sequence, kv head, block of positions) of a packed batch.
std::vector<AttentionTask> prefill_tasks(const std::vector<int64_t>& cu, int64_t kv_heads,
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

template <class Fn> void run_tasks(const std::vector<AttentionTask>& tasks, const AttentionRows& a, Fn* fn) {
  cpu::parallel_tasks(int64_t(tasks.size()), [&](int64_t i) { fn(a, tasks[size_t(i)]); });
}

const char* cpu_dtype_reason(const TensorView& q) {
  if (!q.device.is_cpu()) return "tensors are not on the cpu";
  switch (q.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

}  // namespace

void attention_prefill_cpu(const Context&, const TensorView& out, const TensorView& lse,
                           const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& cu_seqlens, bool causal, double softmax_scale,
                           int64_t window_left) {
  if (q.numel() == 0) return;
  AttentionRows a = rows_of(q, k, v, softmax_scale);
  a.out = out.data;
  a.out_stride = out.row_stride();
  a.lse = static_cast<float*>(lse.data);
  a.tokens = q.size(0);
  // Query positions per task: the f32 query rows and accumulators of the group in half of L2.
  const int64_t block = block_of(2 * a.group, a.head_dim, cpu::CacheLevel::l2);
  const auto tasks = prefill_tasks(index_values(cu_seqlens), a.kv_heads, block,
                                   key_tile(a.head_dim), causal, window_left);
  run_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::forward_task));
}

void attention_decode_cpu(const Context&, const TensorView& out, const TensorView& q,
                          const TensorView& k_cache, const TensorView& v_cache,
                          const TensorView& seq_lens, double softmax_scale) {
  if (q.numel() == 0) return;
  AttentionRows a = rows_of(q, k_cache, v_cache, softmax_scale);
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
                                   : key_tile(a.head_dim);
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
  if (direct) return run_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::decode_task));
  run_tasks(tasks, a, HWY_DYNAMIC_DISPATCH(attention_cpu::forward_task));
}

void attention_prefill_backward_cpu(const Context&, const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv, const TensorView& dout,
                                    const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& cu_seqlens, bool causal,
                                    double softmax_scale, int64_t window_left) {
  if (q.numel() == 0) return;
  AttentionRows a = rows_of(q, k, v, softmax_scale);
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
  const cpu::RowTasks token_tasks{a.tokens, block_of(2 * a.q_heads, a.head_dim, cpu::CacheLevel::l2)};
  auto* delta_fn = HWY_DYNAMIC_DISPATCH(attention_cpu::delta_rows);
  cpu::parallel_tasks(token_tasks.count(), [&](int64_t t) {
    delta_fn(a, out.data, out.row_stride(), delta.data(), token_tasks.begin(t), token_tasks.end(t));
  });
  const std::vector<int64_t> cu = index_values(cu_seqlens);
  // dk, dv: key blocks whose widened K, V and f32 dk, dv rows fit half of L2.
  const int64_t key_block = block_of(4, a.head_dim, cpu::CacheLevel::l2);
  run_tasks(prefill_tasks(cu, a.kv_heads, key_block, key_block, causal, window_left), a,
            HWY_DYNAMIC_DISPATCH(attention_cpu::dkdv_task));
  // dq: query blocks whose q, dout and dq rows (f32, the whole group) fit half of L2.
  const int64_t block = block_of(3 * a.group, a.head_dim, cpu::CacheLevel::l2);
  run_tasks(prefill_tasks(cu, a.kv_heads, block, key_tile(a.head_dim), causal, window_left), a,
            HWY_DYNAMIC_DISPATCH(attention_cpu::dq_task));
}

const char* attention_prefill_cpu_applicable(const TensorView&, const TensorView&,
                                             const TensorView& q, const TensorView&,
                                             const TensorView&, const TensorView&, bool, double,
                                             int64_t) {
  return cpu_dtype_reason(q);
}
const char* attention_decode_cpu_applicable(const TensorView&, const TensorView& q,
                                            const TensorView&, const TensorView&,
                                            const TensorView&, double) {
  return cpu_dtype_reason(q);
}
const char* attention_prefill_backward_cpu_applicable(
    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
    const TensorView& q, const TensorView&, const TensorView&, const TensorView&,
    const TensorView&, const TensorView&, bool, double, int64_t) {
  return cpu_dtype_reason(q);
}

}  // namespace opforge
#endif  // HWY_ONCE
