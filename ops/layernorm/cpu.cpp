// CPU kernels of layer_norm, group_norm and their backward ops: layer_norm_cpu,
// layer_norm_backward_cpu, group_norm_cpu, group_norm_backward_cpu.
//
// Assumes: layer_norm rows follow Note [row layout] (unit-stride rows, any uniform row stride);
// group_norm tensors are contiguous, so a group (n, g) is one run of C / G * spatial elements;
// f32 / bf16 / f16 (f64 goes to the reference: the predicates say so); the op's check has run.
//
// Why it is fast:
// - One Highway source, runtime dispatch (4 / 8 / 16 f32 lanes on SSE4 / AVX2 / AVX-512);
//   bf16 / f16 are widened to f32 in registers and rounded once on the store (Note [vector
//   rounding]). w and b are widened to f32 once per task, not once per row.
// - layer_norm forward (Note [pair order], no widened copy of the row): the one pass from memory
//   sums x - k and (x - k)^2 (k = x[0]); for bf16 / f16 the variance comes from those shifted sums
//   unless x[0] lies far from the mean (then, and always for f32, a centred pass over the row in
//   L1 gives Note [centred sums]). The normalising pass reads the row from L1, forms xhat with one
//   multiply-add for bf16 / f16, prefetches the next row (Note [row prefetch]) and, when the call
//   exceeds the last-level cache, writes y with streaming stores (Note [streaming stores]).
//   bf16 stores skip the rounding's NaN test on rows that cannot produce a NaN (finite sums,
//   parameters and shift, bounded rstd). w and b are widened to f32 once per task.
// - Backward and group_norm, Note [centred sums] (below): the row (or group) is read from memory
//   once, by the pass that sums x - k (k its first element); the centred variance pass and the
//   normalising pass re-read it from L1 / L2: rows per task come from capacity_block (Note
//   [tiling]) so a task's rows fit half of a core's L2. Memory traffic is x + y (forward) or
//   dy + x + dx (backward), the roofline minimum. A group_norm group larger than half the L2 is
//   read three times. group_norm's y past the cache share goes out by streaming stores too.
// - The backward's row sums (the sums of d = x - k, d^2, g = dy * w and g d in the read pass)
//   give dx = rstd * (g - mean(g) - xhat * mean(g xhat)) without another read of memory, and
//   without the centred pass while k lies within a few standard deviations of the mean (Note
//   [shifted backward sums]; else the centred pass runs from cache as in the forward). Its dx
//   pass prefetches the next row's x and dy (Note [row prefetch]) and, past the cache share,
//   writes dx with streaming stores: bf16 16,384 x 4,096 34-36 -> 28-31 ms on the Zen 4 VM
//   (2026-11-29, three repetitions each, side by side). The shifted sums and the dx pass over two
//   rows at a time (Note [row pairs]) then gave, medians of five interleaved runs of the two
//   builds on the same VM (2026-11-29, 20:40-20:50 UTC): bf16 1,024 x 4,096 1.56 -> 1.35 ms,
//   16,384 x 4,096 25.3 -> 23.8 ms; f32 4.06 -> 3.88 and 35.6 -> 30.5 ms (docs/perf/cpu.md).
// - OpenMP over tasks (parallel_tasks: one task means no parallel region, so decode rows pay no
//   fork). Backward dw / db: each chunk of rows (whole tiles of Note [tiling], at most
//   cpu::kMaxPartialChunks: Note [bounded partials]; never per thread) owns an f32 partial row;
//   the partials are added in chunk order in f64 (Note [ordered partials]).
//   group_norm: each (n, group) task writes per-channel partials of row n; they are summed over
//   n in order. Both are deterministic and independent of the thread count.
// Tolerance: the backward kernels declare f32 atol = rtol = 1e-4 (layernorm.cpp,
// cpu_backward_desc): their parameter gradients are long sums of f32 terms.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/layernorm/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "backends/cpu/simd-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/layernorm/internal.h"
#include "backends/cpu/tiling.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::layernorm_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// x - k at lanes [i, i + count), lanes past count zero (load_n gives them 0, and 0 - k is not).
template <class T> HWY_INLINE VF shifted(const T* x, int64_t i, size_t count, VF k) {
  const VF d = hn::Sub(load_n(x + i, count), k);
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return d;
  return hn::IfThenElseZero(hn::FirstN(DF(), count), d);
}

// x - mean at lanes [0, count) as (x - k) - mean_d: x - k is exact when x and k are close
// (Sterbenz) and mean_d is then small, so no f32 rounding of a large mean enters xhat. Lanes
// past count are zero.
template <class T> HWY_INLINE VF centred(const T* x, size_t count, VF k, VF mean_d) {
  const VF c = hn::Sub(hn::Sub(load_n(x, count), k), mean_d);
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return c;
  return hn::IfThenElseZero(hn::FirstN(DF(), count), c);
}

// Four sums over n elements at once: term(i, count, a, b, c, d). Four independent accumulator
// chains, enough to hide the latency of the multiply-adds.
struct Sums4 {
  float a = 0, b = 0, c = 0, d = 0;
};
template <class Term> HWY_INLINE Sums4 sum_over4(int64_t n, Term&& term) {
  const DF df;
  VF a = hn::Zero(df), b = hn::Zero(df), c = hn::Zero(df), d = hn::Zero(df);
  for_each_vector(n, [&](int64_t i, size_t count) { term(i, count, a, b, c, d); });
  return {sum_lanes(a), sum_lanes(b), sum_lanes(c), sum_lanes(d)};
}

// Note [centred sums]: mean = k + mean_d with mean_d = sum(x - k) / n (pass 1, the one read
// from memory), then the variance from the centred values c = (x - k) - mean_d (pass 2, from
// cache) as the corrected two-pass formula (sum(c^2) - sum(c)^2 / n) / n, which stays accurate
// whatever k is (an outlier as the first element included).
struct Stats {
  float mean_d = 0;  // mean of x minus k
  float rstd = 0;
};
HWY_INLINE float rstd_of(float sum_c, float sum_cc, int64_t n, float eps) {
  const float var = std::max((sum_cc - sum_c * sum_c / float(n)) / float(n), 0.0f);
  return 1.0f / std::sqrt(var + eps);
}

// Note [centred sums] over n contiguous elements of x.
template <class T> HWY_INLINE Stats stats_of(const T* x, int64_t n, VF k, float eps) {
  const float sum_d = sum_over(n, [&](int64_t i, size_t count, VF& acc) {
    acc = hn::Add(acc, shifted(x, i, count, k));
  });
  const float mean_d = sum_d / float(n);
  const VF vmean_d = hn::Set(DF(), mean_d);
  auto [sum_c, sum_cc] = sum_over2(n, [&](int64_t i, size_t count, VF& acc_c, VF& acc_cc) {
    const VF c = centred(x + i, count, k, vmean_d);
    acc_c = hn::Add(acc_c, c);
    acc_cc = hn::MulAdd(c, c, acc_cc);
  });
  // sum(c) / n is the rounding error of mean_d (f32 sums of x - k lose digits when k is far
  // from the mean): adding it back gives the mean to f32 accuracy of the centred values.
  return {mean_d + sum_c / float(n), rstd_of(sum_c, sum_cc, n, eps)};
}

// Element 0 of x as f32.
template <class T> HWY_INLINE float first_of(const T* x) { return float(*x); }

// ---- layer_norm forward (Note [pair order]) ------------------------------------------------
// w or b (zeros for nullptr) widened to f32 in the pair order of T, once per task.
template <class T> void widen_pairs(const void* src, float* out, int64_t n) {
  const T* p = static_cast<const T*>(src);
  for_each_pair(
      n,
      [&](int64_t i) {
        VF a, b;
        if (p) load_pair(p + i, a, b);
        else a = b = hn::Zero(DF());
        store_scratch(a, b, out + i);
      },
      [&](int64_t i, size_t count) {
        store_n(p ? load_n(p + i, count) : hn::Zero(DF()), out + i, count);
      });
}

// One row. Pass 1 (the read from memory) sums d = x - k and d^2 (k = x[0]). For bf16 / f16 the
// variance comes from those shifted sums, mean(d^2) - mean(d)^2, when that loses at most 4 of
// f32's 24 bits (mean(d)^2 <= 15/16 mean(d^2), i.e. x[0] within ~4 standard deviations of the
// mean), far below the output's 8 or 11 bits; otherwise, and always for f32, a second pass over
// the cached row gives Note [centred sums]. The normalising pass reads the row from L1 and, for
// bf16 / f16, forms xhat with one multiply-add x * rstd - mean * rstd (its error, an f32 ulp of
// mean / std, is far below a bf16 / f16 ulp); f32 keeps the exact (x - k) - mean_d. That pass
// also prefetches the next row (Note [row prefetch]). y may alias x: each step reads, then writes.
template <class T, bool kStream>
void ln_forward_row(const T* x, const float* w_row, const float* b_row, bool params_finite, T* y,
                    int64_t hidden, float eps, const T* next_x) {
  constexpr bool kExact = std::is_same_v<T, float>;
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d)), step = 2 * lanes, pairs = pair_end(hidden);
  const VF k = hn::Set(d, first_of(x));
  VF s1a = hn::Zero(d), s1b = hn::Zero(d), s1c = hn::Zero(d), s1d = hn::Zero(d);
  VF s2a = hn::Zero(d), s2b = hn::Zero(d), s2c = hn::Zero(d), s2d = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * step <= pairs; i += 2 * step) {
    VF a, b, c, e;
    load_pair(x + i, a, b);
    load_pair(x + i + step, c, e);
    a = hn::Sub(a, k), b = hn::Sub(b, k), c = hn::Sub(c, k), e = hn::Sub(e, k);
    s1a = hn::Add(s1a, a), s1b = hn::Add(s1b, b), s1c = hn::Add(s1c, c), s1d = hn::Add(s1d, e);
    s2a = hn::MulAdd(a, a, s2a), s2b = hn::MulAdd(b, b, s2b);
    s2c = hn::MulAdd(c, c, s2c), s2d = hn::MulAdd(e, e, s2d);
  }
  if (i < pairs) {
    VF a, b;
    load_pair(x + i, a, b);
    a = hn::Sub(a, k), b = hn::Sub(b, k);
    s1a = hn::Add(s1a, a), s1b = hn::Add(s1b, b);
    s2a = hn::MulAdd(a, a, s2a), s2b = hn::MulAdd(b, b, s2b);
    i += step;
  }
  for (; i < hidden; i += lanes) {
    const VF v = shifted(x, i, size_t(std::min(lanes, hidden - i)), k);
    s1c = hn::Add(s1c, v);
    s2c = hn::MulAdd(v, v, s2c);
  }
  const float n = float(hidden);
  const float sum_d = sum_lanes(hn::Add(hn::Add(s1a, s1b), hn::Add(s1c, s1d)));
  const float sum_dd = sum_lanes(hn::Add(hn::Add(s2a, s2b), hn::Add(s2c, s2d)));
  float mean_d = sum_d / n, rstd;
  const float mean_dd = sum_dd / n, mean_d2 = mean_d * mean_d;
  if (kExact || !(mean_d2 <= 0.9375f * mean_dd)) {  // NaN / inf rows take this branch too
    const VF vmean_d = hn::Set(d, mean_d);
    VF ca = hn::Zero(d), cb = hn::Zero(d), cca = hn::Zero(d), ccb = hn::Zero(d);
    for_each_pair(
        hidden,
        [&](int64_t j) {
          VF a, b;
          load_pair(x + j, a, b);
          a = hn::Sub(hn::Sub(a, k), vmean_d), b = hn::Sub(hn::Sub(b, k), vmean_d);
          ca = hn::Add(ca, a), cb = hn::Add(cb, b);
          cca = hn::MulAdd(a, a, cca), ccb = hn::MulAdd(b, b, ccb);
        },
        [&](int64_t j, size_t count) {
          const VF c = centred(x + j, count, k, vmean_d);
          ca = hn::Add(ca, c);
          cca = hn::MulAdd(c, c, cca);
        });
    const float sum_c = sum_lanes(hn::Add(ca, cb)), sum_cc = sum_lanes(hn::Add(cca, ccb));
    // sum(c) / n is the rounding error of mean_d, as in stats_of.
    mean_d += sum_c / n;
    rstd = rstd_of(sum_c, sum_cc, hidden, eps);
  } else {
    rstd = 1.0f / std::sqrt(std::max(mean_dd - mean_d2, 0.0f) + eps);
  }
  const VF vr = hn::Set(d, rstd), vmean_d = hn::Set(d, mean_d);
  const float shift_value = -(first_of(x) + mean_d) * rstd;  // -mean * rstd
  const VF shift = hn::Set(d, shift_value);
  auto xhat = [&](VF v) {
    if constexpr (kExact) return hn::Mul(hn::Sub(hn::Sub(v, k), vmean_d), vr);
    else return hn::MulAdd(v, vr, shift);
  };
  auto normalise = [&](auto no_nan) {
    for_each_pair(
        hidden,
        [&](int64_t j) {
          VF a, b;
          prefetch_step(next_x + j);
          load_pair(x + j, a, b);
          VF wa, wb, ba, bb;
          load_scratch(w_row + j, wa, wb);
          load_scratch(b_row + j, ba, bb);
          const VF ya = hn::MulAdd(xhat(a), wa, ba), yb = hn::MulAdd(xhat(b), wb, bb);
          if constexpr (decltype(no_nan)::value) store_pair_no_nan<kStream>(ya, yb, y + j);
          else store_pair<kStream>(ya, yb, y + j);
        },
        [&](int64_t j, size_t count) {
          store_n(hn::MulAdd(xhat(load_n(x + j, count)), load_n(w_row + j, count),
                             load_n(b_row + j, count)),
                  y + j, count);
        });
  };
  // No lane of y is NaN when the row's sums, w, b and -mean * rstd are finite and rstd <= 1e15:
  // then |x - mean| < 2 sqrt(FLT_MAX), |xhat| < 4e34 (plus an ulp of -mean * rstd) is finite, and
  // xhat * w + b is finite or +-inf. The bf16 stores then skip their NaN test.
  const bool no_nan = params_finite && std::isfinite(sum_d) && std::isfinite(sum_dd) &&
                      rstd <= 1e15f && std::isfinite(mean_d) && std::isfinite(shift_value);
  if (no_nan) normalise(std::true_type());
  else normalise(std::false_type());
}

template <class T, bool kStream>
void ln_forward_rows_typed(const LayerNormRows& a, int64_t begin, int64_t end) {
  if (a.hidden == 0) return;
  std::unique_ptr<float[]> params(new float[2 * size_t(a.hidden)]);
  float *w = params.get(), *b = w + a.hidden;
  widen_pairs<T>(a.w, w, a.hidden);
  widen_pairs<T>(a.b, b, a.hidden);
  // Only bf16 stores have a NaN test to skip; a task of a few rows does not repay the check.
  const bool params_finite = std::is_same_v<T, bf16_t> && end - begin >= 4 && all_finite(w, 2 * a.hidden);
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const int64_t next = row + 1 < a.rows ? 1 : 0;  // the call's last row prefetches itself
    ln_forward_row<T, kStream>(x, w, b, params_finite, static_cast<T*>(a.y) + row * a.y_stride,
                               a.hidden, a.eps, x + next * a.x_stride);
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T> void ln_forward_rows_for(const LayerNormRows& a, int64_t begin, int64_t end) {
  if (a.stream) ln_forward_rows_typed<T, true>(a, begin, end);
  else ln_forward_rows_typed<T, false>(a, begin, end);
}

void layer_norm_forward_rows(const LayerNormRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return ln_forward_rows_for<bf16_t>(a, begin, end);
    case DType::f16: return ln_forward_rows_for<f16_t>(a, begin, end);
    default: return ln_forward_rows_for<float>(a, begin, end);
  }
}

// w and b (zeros when b is none) widened to f32 in natural order: the per-column factors of one
// backward task.
template <class T> struct Params {
  std::unique_ptr<float[]> w, b;
  Params(const void* w_src, const void* b_src, int64_t n) : w(new float[size_t(n)]), b(new float[size_t(n)]) {
    for_each_vector(n, [&](int64_t i, size_t count) {
      store_n(load_n(static_cast<const T*>(w_src) + i, count), w.get() + i, count);
      const VF bias = b_src ? load_n(static_cast<const T*>(b_src) + i, count) : hn::Zero(DF());
      store_n(bias, b.get() + i, count);
    });
  }
};

// ---- layer_norm backward -----------------------------------------------------------------------
// A row's constants for its dx pass: the shift k, the mean of x - k, rstd, mean(g) and
// mean(g * xhat) with g = dy * w.
struct BwdRow {
  float k = 0, mean_d = 0, rstd = 0, mean_g = 0, mean_gx = 0;
};

// The read of a row from memory (and, for an outlier first element, its centred pass from cache).
template <class T> BwdRow ln_backward_sums(const T* dy, const T* x, const float* w, int64_t hidden, float eps) {
  BwdRow r;
  r.k = first_of(x);
  const VF k = hn::Set(DF(), r.k);
  // Pass 1 (the read from memory): with d = x - k and g = dy * w, the sums of d, d^2, g and g d.
  const Sums4 p1 = sum_over4(hidden, [&](int64_t i, size_t count, VF& sd, VF& sdd, VF& sg, VF& sgd) {
    const VF d = shifted(x, i, count, k);
    const VF g = hn::Mul(load_n(dy + i, count), load_n(w + i, count));
    sd = hn::Add(sd, d);
    sdd = hn::MulAdd(d, d, sdd);
    sg = hn::Add(sg, g);
    sgd = hn::MulAdd(g, d, sgd);
  });
  const float n = float(hidden);
  const float sum_g = p1.c;
  r.mean_d = p1.a / n;
  float sum_gc;  // sum of g (x - mean)
  if (p1.a * r.mean_d <= 8.0f * (p1.b - p1.a * r.mean_d)) {
    // Note [shifted backward sums]: k within about 3 standard deviations of the mean (the
    // cancellation in sum d^2 - n mean_d^2 at most 8x the centred sum): the shifted sums are as
    // accurate as the centred ones, and the centred pass is saved.
    r.rstd = rstd_of(p1.a, p1.b, hidden, eps);
    sum_gc = p1.d - r.mean_d * sum_g;
  } else {
    // Pass 2 (from cache), an outlier first element or a NaN: centred sums, Note [centred sums].
    const VF mean_d = hn::Set(DF(), r.mean_d);
    const Sums4 sums = sum_over4(hidden, [&](int64_t i, size_t count, VF& sc, VF& scc, VF& sgc, VF&) {
      const VF c = centred(x + i, count, k, mean_d);
      sc = hn::Add(sc, c);
      scc = hn::MulAdd(c, c, scc);
      sgc = hn::MulAdd(hn::Mul(load_n(dy + i, count), load_n(w + i, count)), c, sgc);
    });
    const float correction = sums.a / n;  // the rounding error of mean_d, as in stats_of
    r.mean_d += correction;
    r.rstd = rstd_of(sums.a, sums.b, hidden, eps);
    sum_gc = sums.c - correction * sum_g;
  }
  r.mean_g = sum_g / n;
  r.mean_gx = r.rstd * sum_gc / n;  // mean(g * xhat)
  return r;
}

// The dx pass of R rows (1 or 2) at once, from cache: dx, and dy * xhat, dy added into the
// chunk's partial rows dw_part, db_part, row after row (the order of the single-row pass, so the
// same sums), with one load and store of each partial per R rows (Note [row pairs]). dx leaves
// with streaming stores under kStream (Note [streaming stores]); the pass prefetches the R rows
// after (next_x, next_dy, rows `stride` elements apart: Note [row prefetch]), so that pass 1 of
// those rows finds them in cache.
template <class T, bool kStream, int R>
void ln_backward_dx(const T* const (&dy)[R], const T* const (&x)[R], T* const (&dx)[R], const BwdRow (&c)[R],
                    const float* w, float* dw_part, float* db_part, int64_t hidden, const T* next_x,
                    const T* next_dy, int64_t next_stride_x, int64_t next_stride_dy) {
  if constexpr (kStream && R > 1) {  // Note [line blocks] (src/backends/cpu/tiling.h)
    for (int64_t c0 = 0; c0 < hidden; c0 += cpu::kLineBlock) {
      const int64_t n = std::min(cpu::kLineBlock, hidden - c0);
      for (int q = 0; q < R; ++q) {
        const T* const qdy[1] = {dy[q] + c0};
        const T* const qx[1] = {x[q] + c0};
        T* const qdx[1] = {dx[q] + c0};
        const BwdRow qc[1] = {c[q]};
        ln_backward_dx<T, kStream, 1>(qdy, qx, qdx, qc, w + c0, dw_part + c0, db_part + c0, n,
                                      next_x + q * next_stride_x + c0, next_dy + q * next_stride_dy + c0, 0, 0);
      }
    }
    return;
  }
  VF k[R], mean[R], rstd[R], mean_g[R], mean_gx[R];
  for (int r = 0; r < R; ++r) {
    k[r] = hn::Set(DF(), c[r].k), mean[r] = hn::Set(DF(), c[r].mean_d), rstd[r] = hn::Set(DF(), c[r].rstd);
    mean_g[r] = hn::Set(DF(), c[r].mean_g), mean_gx[r] = hn::Set(DF(), c[r].mean_gx);
  }
  constexpr int64_t kLineElements = 64 / int64_t(sizeof(T));
  for_each_vector(hidden, [&](int64_t i, size_t count) {
    if (i % kLineElements == 0)
      for (int r = 0; r < R; ++r) {
        hwy::Prefetch(next_x + r * next_stride_x + i);
        hwy::Prefetch(next_dy + r * next_stride_dy + i);
      }
    const VF wv = load_n(w + i, count);
    VF dw = load_n(dw_part + i, count), db = load_n(db_part + i, count);
    for (int r = 0; r < R; ++r) {
      const VF g_up = load_n(dy[r] + i, count);
      const VF xhat = hn::Mul(centred(x[r] + i, count, k[r], mean[r]), rstd[r]);
      const VF inner = hn::NegMulAdd(xhat, mean_gx[r], hn::Sub(hn::Mul(g_up, wv), mean_g[r]));
      if (kStream && count == hn::Lanes(DF())) store<true>(hn::Mul(rstd[r], inner), dx[r] + i);
      else store_n(hn::Mul(rstd[r], inner), dx[r] + i, count);
      dw = hn::MulAdd(g_up, xhat, dw);
      db = hn::Add(g_up, db);
    }
    store_n(dw, dw_part + i, count);
    store_n(db, db_part + i, count);
  });
}

// Note [row pairs]: the chunk's rows go two at a time through the dx pass (each row's sums are
// taken first, one row after the other), so the f32 partials dw_part and db_part (4 bytes an
// element each, beside 2 of x and 2 of dy in bf16) are read and written once per two rows; the
// two rows' x and dy stay in L2 between their sums and their dx pass.
template <class T, bool kStream>
void ln_backward_chunk_typed(const LayerNormRows& a, int64_t begin, int64_t end, float* dw_part,
                             float* db_part) {
  std::fill(dw_part, dw_part + a.hidden, 0.0f);
  std::fill(db_part, db_part + a.hidden, 0.0f);
  if (a.hidden == 0) return;
  const Params<T> p(a.w, nullptr, a.hidden);
  const float* w = p.w.get();
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  const int64_t last = a.rows - 1;
  // Rows row .. row + R - 1: their sums one after the other, then one dx pass, which prefetches
  // the R rows after (the call's last rows: themselves).
  auto rows = [&]<int R>(int64_t row) {
    const T* rx[R];
    const T* rdy[R];
    T* rdx[R];
    BwdRow c[R];
    for (int r = 0; r < R; ++r) {
      rx[r] = x + (row + r) * a.x_stride, rdy[r] = dy + (row + r) * a.dy_stride, rdx[r] = dx + (row + r) * a.dx_stride;
      c[r] = ln_backward_sums(rdy[r], rx[r], w, a.hidden, a.eps);
    }
    const int64_t next = std::min(row + R, last), step = next + R - 1 <= last ? 1 : 0;
    ln_backward_dx<T, kStream, R>(rdy, rx, rdx, c, w, dw_part, db_part, a.hidden, x + next * a.x_stride,
                                  dy + next * a.dy_stride, step * a.x_stride, step * a.dy_stride);
  };
  int64_t row = begin;
  for (; row + 1 < end; row += 2) rows.template operator()<2>(row);
  if (row < end) rows.template operator()<1>(row);
  if constexpr (kStream) hwy::FlushStream();
}
template <class T>
void ln_backward_chunk_for(const LayerNormRows& a, int64_t begin, int64_t end, float* dw_part,
                           float* db_part) {
  if (a.stream) ln_backward_chunk_typed<T, true>(a, begin, end, dw_part, db_part);
  else ln_backward_chunk_typed<T, false>(a, begin, end, dw_part, db_part);
}

void layer_norm_backward_chunk(const LayerNormRows& a, int64_t begin, int64_t end, float* dw_part,
                               float* db_part) {
  switch (a.dtype) {
    case DType::bf16: return ln_backward_chunk_for<bf16_t>(a, begin, end, dw_part, db_part);
    case DType::f16: return ln_backward_chunk_for<f16_t>(a, begin, end, dw_part, db_part);
    default: return ln_backward_chunk_for<float>(a, begin, end, dw_part, db_part);
  }
}

// ---- group_norm --------------------------------------------------------------------------------
// Forward of group (n, g): statistics over the whole contiguous group, then per channel
// y = (x - mean) * (rstd * w[c]) + b[c].
// kStream: whole vectors of y by non-temporal stores (every channel row starts 64-byte aligned:
// cpu::stream_outputs checked; a whole vector at a whole-vector offset is aligned), tails plain.
template <class T, bool kStream> void gn_forward_group(const GroupNormArgs& a, int64_t group) {
  const int64_t per_group = a.channels / a.groups, len = per_group * a.spatial;
  if (len == 0) return;
  const T* x = static_cast<const T*>(a.x) + group * len;
  T* y = static_cast<T*>(a.y) + group * len;
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  const int64_t first_channel = (group % a.groups) * per_group;
  const VF k = hn::Set(DF(), first_of(x));
  const Stats s = stats_of(x, len, k, a.eps);
  const VF mean_d = hn::Set(DF(), s.mean_d);
  for (int64_t c = 0; c < per_group; ++c) {
    const int64_t channel = first_channel + c;
    const VF scale = hn::Set(DF(), s.rstd * first_of(w + channel));
    const VF shift = hn::Set(DF(), first_of(b + channel));
    const T* xc = x + c * a.spatial;
    T* yc = y + c * a.spatial;
    for_each_vector(a.spatial, [&](int64_t i, size_t count) {
      const VF v = hn::MulAdd(centred(xc + i, count, k, mean_d), scale, shift);
      if (kStream && count == hn::Lanes(DF())) store<true>(v, yc + i);
      else store_n(v, yc + i, count);
    });
  }
}

// Backward of group (n, g): per-channel sums of d, d^2, dy and dy d in one read, then dx; the
// channel's dw and db terms go to dw_part[c], db_part[c] (row n of the [N, C] partials).
template <class T>
void gn_backward_group(const GroupNormArgs& a, int64_t group, float* dw_part, float* db_part) {
  const int64_t per_group = a.channels / a.groups, len = per_group * a.spatial;
  const int64_t first_channel = (group % a.groups) * per_group;
  dw_part += first_channel;
  db_part += first_channel;
  if (len == 0) {
    std::fill(dw_part, dw_part + per_group, 0.0f);
    std::fill(db_part, db_part + per_group, 0.0f);
    return;
  }
  const T* x = static_cast<const T*>(a.x) + group * len;
  const T* dy = static_cast<const T*>(a.dy) + group * len;
  T* dx = static_cast<T*>(a.dx) + group * len;
  if (len == 1) {
    // A group of one element normalizes to xhat = 0 whatever x is: dx = 0, dw = 0, db = dy. The
    // general path gives dx = rstd (dy w - mean(dy w)) with rstd = 1 / sqrt(eps), which turns the
    // rounding of dy w into 1e-4 (check --fuzz: 2 x 131 x 1 with 131 groups).
    store_n(hn::Zero(DF()), dx, 1);
    dw_part[0] = 0.0f;
    db_part[0] = first_of(dy);
    return;
  }
  const T* w = static_cast<const T*>(a.w) + first_channel;
  const VF k = hn::Set(DF(), first_of(x));
  // Pass 1 (the read from memory): the group's sum(x - k), and sum(dy) of each channel (db).
  const float sum_d = sum_over(len, [&](int64_t i, size_t count, VF& acc) {
    acc = hn::Add(acc, shifted(x, i, count, k));
  });
  float sum_g = 0;
  for (int64_t c = 0; c < per_group; ++c) {
    db_part[c] = sum_over(a.spatial, [&](int64_t i, size_t count, VF& acc) {
      acc = hn::Add(acc, load_n(dy + c * a.spatial + i, count));
    });
    sum_g += first_of(w + c) * db_part[c];
  }
  // Pass 2 (from cache): centred sums, Note [centred sums]; sum(dy * c) of each channel.
  const float mean_d_value = sum_d / float(len);
  const VF mean_d = hn::Set(DF(), mean_d_value);
  float sum_c = 0, sum_cc = 0, sum_gc = 0;
  for (int64_t c = 0; c < per_group; ++c) {
    const int64_t off = c * a.spatial;
    const Sums4 cs = sum_over4(a.spatial, [&](int64_t i, size_t count, VF& sc, VF& scc, VF& syc, VF&) {
      const VF centred_x = centred(x + off + i, count, k, mean_d);
      sc = hn::Add(sc, centred_x);
      scc = hn::MulAdd(centred_x, centred_x, scc);
      syc = hn::MulAdd(load_n(dy + off + i, count), centred_x, syc);
    });
    sum_c += cs.a;
    sum_cc += cs.b;
    sum_gc += first_of(w + c) * cs.c;
    dw_part[c] = cs.c;  // sum dy * c for now; dw = rstd * that
  }
  const float n = float(len);
  const float correction = sum_c / n;  // the rounding error of mean_d, as in stats_of
  const Stats s{mean_d_value + correction, rstd_of(sum_c, sum_cc, len, a.eps)};
  const VF rstd = hn::Set(DF(), s.rstd), mean_corrected = hn::Set(DF(), s.mean_d);
  const VF mean_g = hn::Set(DF(), sum_g / n);
  const VF mean_gx = hn::Set(DF(), s.rstd * (sum_gc - correction * sum_g) / n);
  for (int64_t c = 0; c < per_group; ++c) {
    dw_part[c] = s.rstd * (dw_part[c] - correction * db_part[c]);  // sum dy * xhat
    const int64_t off = c * a.spatial;
    const VF wc = hn::Set(DF(), first_of(w + c));
    for_each_vector(a.spatial, [&](int64_t i, size_t count) {
      const VF xhat = hn::Mul(centred(x + off + i, count, k, mean_corrected), rstd);
      const VF g = hn::Mul(load_n(dy + off + i, count), wc);
      const VF inner = hn::NegMulAdd(xhat, mean_gx, hn::Sub(g, mean_g));
      store_n(hn::Mul(rstd, inner), dx + off + i, count);
    });
  }
}

template <class T>
void gn_groups_typed(const GroupNormArgs& a, int64_t begin, int64_t end, float* dw_part,
                     float* db_part) {
  for (int64_t group = begin; group < end; ++group) {
    if (!a.dy) {
      if (a.stream) gn_forward_group<T, true>(a, group);
      else gn_forward_group<T, false>(a, group);
    } else {
      const int64_t n = group / a.groups;
      gn_backward_group<T>(a, group, dw_part + n * a.channels, db_part + n * a.channels);
    }
  }
  if (a.stream) hwy::FlushStream();
}

// Groups [begin, end) of group_norm (forward when a.dy is nullptr, else backward; partials are
// [batch, channels] f32).
void group_norm_groups(const GroupNormArgs& a, int64_t begin, int64_t end, float* dw_part,
                       float* db_part) {
  switch (a.dtype) {
    case DType::bf16: return gn_groups_typed<bf16_t>(a, begin, end, dw_part, db_part);
    case DType::f16: return gn_groups_typed<f16_t>(a, begin, end, dw_part, db_part);
    default: return gn_groups_typed<float>(a, begin, end, dw_part, db_part);
  }
}

}  // namespace opforge::layernorm_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstdint>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace layernorm_cpu {
HWY_EXPORT(layer_norm_forward_rows);
HWY_EXPORT(layer_norm_backward_chunk);
HWY_EXPORT(group_norm_groups);
}  // namespace layernorm_cpu

namespace {

// Blocks of `rows` units of `unit` elements each: Note [tiling] over L2 with
// `tensors_per_element` tensors of `itemsize` touched at each element.
cpu::RowTasks tasks_of(int64_t rows, int64_t unit, int64_t tensors_per_element, int64_t itemsize) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * itemsize;
  spec.multiplier = std::max<int64_t>(unit, 1);
  spec.level = cpu::CacheLevel::l2;
  return cpu::row_blocks(rows, spec);
}

std::unique_ptr<float[]> floats(int64_t n) {
  return std::unique_ptr<float[]>(new float[size_t(std::max<int64_t>(n, 1))]);
}

GroupNormArgs group_args(const TensorView& x, const TensorView& w, int64_t num_groups, double eps) {
  GroupNormArgs a;
  a.dtype = x.dtype;
  a.batch = x.size(0);
  a.channels = x.size(1);
  a.groups = num_groups;
  a.spatial = a.batch > 0 && a.channels > 0 ? x.numel() / (a.batch * a.channels) : 0;
  a.eps = float(eps);
  a.x = x.data;
  a.w = w.data;
  return a;
}

}  // namespace

// Note [ordered partials]: the parameter gradients of the family's backward kernels are summed
// over f32 partials (one row of `columns` per chunk of rows, or per batch entry for group_norm)
// in chunk order, in f64, and rounded once to the dtype. Chunks are fixed by Note [tiling], so
// the result does not depend on the thread count; f64 keeps the long sums (16384 rows) free of
// f32 cancellation error. Columns are split into tasks with every chunk's block in L2.
void reduce_partials_in_order(const float* partials, int64_t n_parts, int64_t columns,
                              const TensorView& dst) {
  cpu::TileSpec spec;
  spec.bytes_per_element = int64_t(sizeof(float)) * std::max<int64_t>(n_parts, 1) + 8;
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks tasks{columns, cpu::capacity_block(spec)};
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    const int64_t begin = tasks.begin(t), end = tasks.end(t);
    std::vector<double> sum(size_t(end - begin), 0.0);
    for (int64_t p = 0; p < n_parts; ++p) {
      const float* part = partials + p * columns + begin;
      for (int64_t j = 0; j < end - begin; ++j) sum[size_t(j)] += double(part[j]);
    }
    for (int64_t j = 0; j < end - begin; ++j)
      store_from_double(dst.data, dst.dtype, (begin + j) * dst.stride(0), sum[size_t(j)]);
  });
}

void layer_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, double eps) {
  LayerNormRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.b = b.defined() ? b.data : nullptr;
  a.y = y.data;
  a.y_stride = y.row_stride();
  a.rows = x.rows();
  a.stream = cpu::stream_outputs(2 * double(x.rows()) * double(a.hidden * x.itemsize()), {&y});
  // Rows are independent: Note [balanced tasks].
  const cpu::RowTasks tasks = cpu::balanced(tasks_of(x.rows(), a.hidden, 2, x.itemsize()));
  auto* rows_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::layer_norm_forward_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { rows_fn(a, tasks.begin(t), tasks.end(t)); });
}

void layer_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, double eps) {
  LayerNormRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  a.rows = x.rows();
  a.stream = cpu::stream_outputs(3 * double(x.rows()) * double(a.hidden * x.itemsize()), {&dx});
  // Note [bounded partials]: whole tiles per chunk, at most cpu::kMaxPartialChunks partial rows.
  const cpu::RowTasks chunks = cpu::partial_chunks(tasks_of(x.rows(), a.hidden, 3, x.itemsize()));
  const int64_t n_chunks = chunks.count(), hidden = a.hidden;
  auto dw_parts = floats(n_chunks * hidden), db_parts = floats(n_chunks * hidden);
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::layer_norm_backward_chunk);
  cpu::parallel_tasks(n_chunks, [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), dw_parts.get() + c * hidden,
             db_parts.get() + c * hidden);
  });
  reduce_partials_in_order(dw_parts.get(), n_chunks, hidden, dw);
  reduce_partials_in_order(db_parts.get(), n_chunks, hidden, db);
}

void group_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, int64_t num_groups, double eps) {
  GroupNormArgs a = group_args(x, w, num_groups, eps);
  a.b = b.data;
  a.y = y.data;
  a.stream = cpu::stream_outputs(2 * double(x.numel()) * double(x.itemsize()), {&y});
  const int64_t len = a.channels / num_groups * a.spatial;
  const cpu::RowTasks tasks = tasks_of(a.batch * num_groups, len, 2, x.itemsize());
  auto* groups_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::group_norm_groups);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    groups_fn(a, tasks.begin(t), tasks.end(t), nullptr, nullptr);
  });
}

void group_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, int64_t num_groups, double eps) {
  GroupNormArgs a = group_args(x, w, num_groups, eps);
  a.dy = dy.data;
  a.dx = dx.data;
  const int64_t len = a.channels / num_groups * a.spatial;
  auto dw_parts = floats(a.batch * a.channels), db_parts = floats(a.batch * a.channels);
  const cpu::RowTasks tasks = tasks_of(a.batch * num_groups, len, 3, x.itemsize());
  auto* groups_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::group_norm_groups);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    groups_fn(a, tasks.begin(t), tasks.end(t), dw_parts.get(), db_parts.get());
  });
  reduce_partials_in_order(dw_parts.get(), a.batch, a.channels, dw);
  reduce_partials_in_order(db_parts.get(), a.batch, a.channels, db);
}

const char* layer_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                      const TensorView&, double) {
  return layernorm_cpu_reason(x);
}
const char* layer_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView& x, const TensorView&, double) {
  return layernorm_cpu_reason(x);
}
const char* group_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                      const TensorView&, int64_t, double) {
  return layernorm_cpu_reason(x);
}
const char* group_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView& x, const TensorView&, int64_t,
                                               double) {
  return layernorm_cpu_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
