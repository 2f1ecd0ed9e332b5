// Per-target building blocks of the attention cpu kernels (cpu.cpp, cpu_backward.cpp): f32 rows
// padded to whole vectors, dot products, weighted sums, the online softmax, per-thread scratch,
// K/V tiles. Include after "hwy/foreach_target.h"; the per-target include guard below lets
// foreach_target re-include it for every target.

#if defined(OPFORGE_OPS_ATTENTION_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_ATTENTION_CPU_INL_H_
#undef OPFORGE_OPS_ATTENTION_CPU_INL_H_
#else
#define OPFORGE_OPS_ATTENTION_CPU_INL_H_
#endif

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
inline void dots(const float* q, const float* keys, int64_t n, int64_t dp, float* s) {
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
inline void weighted_sum(const float* w, const float* rows, int64_t n, int64_t dp, float* acc) {
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
inline float exp_in_place(float* s, int64_t n, float mul, float sub) {
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
inline void online_update(float* s, int64_t n, const float* values, int64_t dp, RowState& st, float* acc) {
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
inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
inline float* sized(std::vector<float>& v, int64_t n) {
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
inline void load_tile(const AttentionRows& a, const AttentionTask& t, int64_t j0, int64_t j1, int64_t dp,
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
inline void group_dots(const float* q, int64_t G, int64_t dp, const T* keys, int64_t k_step, int64_t n,
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
inline void group_weighted_sum(const float* p, int64_t stride, int64_t n, int64_t G, const T* values,
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
inline void online_scale(float* s, int64_t n, int64_t dp, RowState& st, float* acc) {
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

// Tokens per pass of group_dots / group_weighted_sum in decode: a register-blocking factor (accumulator
// load/store amortised over 8 keys, an 8-deep chain of independent FMAs per accumulator), not a
// cache tile.
constexpr int64_t kValueRun = 8;

}  // namespace opforge::attention_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
