// CPU kernels of the norm family: rms_norm_cpu, rms_norm_backward_cpu, fused_add_rms_norm_cpu,
// fused_add_rms_norm_backward_cpu.
//
// Assumes: Note [row layout] (unit-stride rows, any uniform row stride), f32 / bf16 / f16 (f64
// goes to the reference kernel: the predicates say so), the op's check has run.
//
// Why it is fast:
// - One Highway source, runtime dispatch: 4 f32 lanes on SSE4/NEON, 8 on AVX2, 16 on AVX-512.
//   bf16/f16 are widened to f32 in registers and rounded once on the store (Note [vector
//   rounding]).
// - bf16 rows move in pair steps (Note [pair order], backends/cpu/simd-inl.h): one 32-bit load
//   splits 2N bf16 into two f32 vectors with an and and a shift, one blend joins them on the
//   store; no pack or cross-lane permute, which on targets that split 256-bit vectors (Zen 1)
//   cost more than the arithmetic. The NaN fix-up of the rounding runs only for vectors that hold
//   a NaN. f16 uses the F16C instructions on x86 (one instruction each way). On the 2-core Zen 1
//   development machine this cut the CPU time per bf16 row by 1.4-2.4x and per f16 row by 3-6x.
// - w + offset is widened to f32 once per task (gain_row), not once per row.
// - Each row is read from memory once: pass 1 (sum of squares; the fused op also adds and stores
//   s) pulls the row into L1/L2, pass 2 (normalise, or the backward's dx and dw terms) re-reads it
//   from there. Forward moves x + w + y bytes, i.e. the roofline minimum.
// - The forward's pass 2 prefetches the next row of the task (Note [row prefetch], bf16 / f16):
//   without it the bus idles while pass 2 computes, and pass 1 waits on memory.
// - Calls whose bytes exceed the last-level cache write their outputs with non-temporal stores
//   (Note [streaming stores]): no read-for-ownership of y (s, dx, dresidual), a third less DRAM
//   traffic for the forward; the fused forward then keeps s in a scratch row (in L1) in pass 1
//   and copies it out in pass 2, so nothing streamed is read back and s is not recomputed.
// - bf16 forward stores skip the rounding's NaN test when the row's sum of squares, rstd and
//   the gain are finite (then no lane of y is NaN); tasks of fewer than 4 rows do not check.
// - OpenMP over tasks of rows; rows per task from capacity_block (Note [tiling]) so one task's
//   rows fit half of a core's L2. One task means no OpenMP region (decode rows cost no fork).
// - Backward dw: each chunk of rows (whole tiles of Note [tiling], at most
//   cpu::kMaxPartialChunks chunks: Note [bounded partials] in tiling.h; never per thread) sums
//   dy * x * rstd into its own f32 partial row; the partials are then added in chunk order,
//   vectorised over columns. Deterministic, and independent of the thread count. With a chunk
//   per tile the partials grew with the rows (2,048 of them at 16,384 x 4,096 with 8-row tiles):
//   fused_add_rms_norm_backward bf16 there took 51-62 ms, 34-40 ms with the bound (Zen 4 VM,
//   2026-11-29, same run; docs/perf/cpu.md). The second pass takes two rows at a time (Note [row
//   pairs] in ops/layernorm/cpu.cpp), one load and store of the partial per two rows: medians of
//   three interleaved runs (Zen 4 VM, 2026-11-29), rms_norm_backward 1,024 / 16,384 x 4,096 bf16
//   1.23 -> 0.99 / 17.5 -> 17.0 ms, f32 2.32 -> 1.87 / 31.4 -> 26.4 ms; fused_add_rms_norm_backward
//   bf16 2.45 -> 2.05 / 42.4 -> 40.2, f32 3.39 -> 3.52 / 60.7 -> 50.1 ms.
//
// Measured before the pair steps and streaming stores (16-core Xeon VM, AVX-512 target, 16
// threads; a parallel copy reached 220 GB/s in L3 and 95 GB/s from DRAM in the same run; shared
// hosts vary by ~30% run to run): rms_norm 1024x4096 f32 175 us = 192 GB/s, bf16 118 us = 142
// GB/s (bf16 is bound by the conversions while the data sits in L3); 16384x4096 f32 5.8 ms = 92
// GB/s, bf16 2.75 ms = 98 GB/s (the DRAM ceiling). Backward 16384x4096: f32 88 GB/s, bf16 104
// GB/s. docs/perf/cpu.md has the 2-core development machine.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "backends/cpu/simd-inl.h"
#include "backends/cpu/tiling.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/norm/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::norm_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// s of the fused op at lanes [i, i + count): x + residual rounded to T (Note [rounding]).
template <class T>
HWY_INLINE VF fused_sum(const T* x, const T* residual, int64_t i, size_t count) {
  return round_to<T>(hn::Add(load_n(x + i, count), load_n(residual + i, count)));
}

// The same for a pair step (Note [pair order]).
template <class T>
HWY_INLINE void fused_sum_pair(const T* x, const T* residual, int64_t i, VF& a, VF& b) {
  VF xa, xb, ra, rb;
  load_pair(x + i, xa, xb);
  load_pair(residual + i, ra, rb);
  a = round_to<T>(hn::Add(xa, ra));
  b = round_to<T>(hn::Add(xb, rb));
}

// Sum over a row in pair steps: pair(i, acc_a, acc_b) adds a pair step, tail(i, count, acc) a
// tail vector. Four accumulators: consecutive multiply-adds do not wait on each other.
template <class Pair, class Tail> HWY_INLINE float sum_pairs(int64_t n, Pair&& pair, Tail&& tail) {
  const DF d;
  const int64_t step = 2 * int64_t(hn::Lanes(d));
  VF a0 = hn::Zero(d), b0 = hn::Zero(d), a1 = hn::Zero(d), b1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * step <= n; i += 2 * step) {
    pair(i, a0, b0);
    pair(i + step, a1, b1);
  }
  if (i + step <= n) {
    pair(i, a0, b0);
    i += step;
  }
  for (; i < n; i += step / 2) tail(i, size_t(std::min(step / 2, n - i)), a1);
  return sum_lanes(hn::Add(hn::Add(a0, b0), hn::Add(a1, b1)));
}

// Copies the elements of one pair step from src to dst, bits unchanged.
template <bool kStream, class T> HWY_INLINE void copy_pair(const T* src, T* dst) {
  const DU du;
  constexpr size_t kVectors = sizeof(T) / 2;  // u32 vectors per pair step: bf16 / f16 1, f32 2
  const size_t lanes = hn::Lanes(du);
  for (size_t v = 0; v < kVectors; ++v) {
    put<kStream>(hn::LoadU(du, reinterpret_cast<const uint32_t*>(src) + v * lanes), du,
                 reinterpret_cast<uint32_t*>(dst) + v * lanes);
  }
}

// One forward row. Pass 1 (the read from memory) sums the squares; the fused op forms s = x +
// residual (rounded to T) there and keeps it in s_row, a scratch row of T that stays in L1, so
// pass 2 neither recomputes s nor reads back what went to memory. Pass 2 normalises from the
// cached row (x, or s_row), copies s_row to s and prefetches the next row (Note [row prefetch]).
// Without streaming stores s_row is s itself. s may alias residual (pass 1 reads each step of
// residual before writing it) and y may alias x (pass 2 reads each step of x, or of s_row,
// before writing y). When the sum of squares, rstd and the gain are finite, no lane of y can be
// NaN and the bf16 stores skip the NaN test.
template <class T, bool kFused, bool kStream>
void forward_row(const T* x, const T* residual, const float* gain, bool gain_finite, T* y, T* s,
                 T* s_row, int64_t hidden, float eps, const T* next_x, const T* next_residual) {
  const float sum_sq = sum_pairs(
      hidden,
      [&](int64_t i, VF& acc_a, VF& acc_b) {
        VF a, b;
        if constexpr (kFused) {
          fused_sum_pair(x, residual, i, a, b);
          store_pair_exact(a, b, s_row + i);
        } else {
          load_pair(x + i, a, b);
        }
        acc_a = hn::MulAdd(a, a, acc_a);
        acc_b = hn::MulAdd(b, b, acc_b);
      },
      [&](int64_t i, size_t count, VF& acc) {
        VF v;
        if constexpr (kFused) {
          v = fused_sum(x, residual, i, count);
          store_n(v, s_row + i, count);
        } else {
          v = load_n(x + i, count);
        }
        acc = hn::MulAdd(v, v, acc);
      });
  const float rstd = 1.0f / std::sqrt(sum_sq / float(hidden) + eps);
  const VF vr = hn::Set(DF(), rstd);
  const T* src = kFused ? s_row : x;
  constexpr bool kPrefetch = sizeof(T) == 2;
  auto normalise = [&](auto no_nan) {
    for_each_pair(
        hidden,
        [&](int64_t i) {
          VF a, b, ga, gb;
          if constexpr (kPrefetch) {
            prefetch_step(next_x + i);
            if constexpr (kFused) prefetch_step(next_residual + i);
          }
          if constexpr (kFused && kStream) copy_pair<true>(s_row + i, s + i);
          load_pair(src + i, a, b);
          load_scratch(gain + i, ga, gb);
          const VF ya = hn::Mul(hn::Mul(a, vr), ga), yb = hn::Mul(hn::Mul(b, vr), gb);
          if constexpr (decltype(no_nan)::value) store_pair_no_nan<kStream>(ya, yb, y + i);
          else store_pair<kStream>(ya, yb, y + i);
        },
        [&](int64_t i, size_t count) {
          const VF v = load_n(src + i, count);
          if constexpr (kFused && kStream) store_n(v, s + i, count);
          store_n(hn::Mul(hn::Mul(v, vr), load_n(gain + i, count)), y + i, count);
        });
  };
  if (gain_finite && std::isfinite(sum_sq) && std::isfinite(rstd)) normalise(std::true_type());
  else normalise(std::false_type());
}

template <class T, bool kFused, bool kStream>
void forward_rows_typed(const NormForwardRows& a, int64_t begin, int64_t end) {
  const size_t n = size_t(a.hidden);
  std::unique_ptr<float[]> gain(new float[std::max<size_t>(n, 1)]);
  gain_row(static_cast<const T*>(a.w), a.offset, gain.get(), a.hidden);
  // Only bf16 stores have a NaN test to skip; a task of a few rows does not repay the check.
  const bool gain_finite = std::is_same_v<T, bf16_t> && end - begin >= 4 && all_finite(gain.get(), a.hidden);
  std::unique_ptr<T[]> s_row(kFused && kStream ? new T[n] : nullptr);
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* residual = kFused ? static_cast<const T*>(a.residual) + row * a.residual_stride : nullptr;
    T* y = static_cast<T*>(a.y) + row * a.y_stride;
    T* s = kFused ? static_cast<T*>(a.s) + row * a.s_stride : nullptr;
    // The row pass 2 prefetches: the next one of the call, which with static scheduling is
    // mostly this thread's next task (the call's last row prefetches itself).
    const int64_t next = row + 1 < a.rows ? 1 : 0;
    // Without streaming stores s itself is the cached row: pass 1 writes it, pass 2 reads it.
    T* cached_s = kStream ? s_row.get() : s;
    forward_row<T, kFused, kStream>(x, residual, gain.get(), gain_finite, y, s, cached_s, a.hidden,
                                    a.eps,
                                    x + next * a.x_stride,
                                    kFused ? residual + next * a.residual_stride : nullptr);
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T> void forward_rows_for(const NormForwardRows& a, int64_t begin, int64_t end) {
  if (a.residual) {
    if (a.stream) forward_rows_typed<T, true, true>(a, begin, end);
    else forward_rows_typed<T, true, false>(a, begin, end);
  } else {
    if (a.stream) forward_rows_typed<T, false, true>(a, begin, end);
    else forward_rows_typed<T, false, false>(a, begin, end);
  }
}

void norm_forward_rows(const NormForwardRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return forward_rows_for<bf16_t>(a, begin, end);
    case DType::f16: return forward_rows_for<f16_t>(a, begin, end);
    default: return forward_rows_for<float>(a, begin, end);
  }
}

// Pointers of one backward row.
template <class T> struct BackwardRow {
  const T* dy;
  const T* ds;
  const T* x;
  const T* residual;
  T* dx;
  T* dresidual;
};

template <class T, bool kFused> HWY_INLINE VF input_at(const BackwardRow<T>& r, int64_t i, size_t count) {
  if constexpr (kFused) return fused_sum(r.x, r.residual, i, count);
  return load_n(r.x + i, count);
}

template <class T, bool kFused>
HWY_INLINE void input_pair(const BackwardRow<T>& r, int64_t i, VF& a, VF& b) {
  if constexpr (kFused) fused_sum_pair(r.x, r.residual, i, a, b);
  else load_pair(r.x + i, a, b);
}

// The backward terms of lanes holding input v, upstream dy, gain g (and ds): dx into `dx`, and
// the dw partial `partial` += dy * v * rstd.
struct BackwardCoef {
  VF rstd, coef;
};
HWY_INLINE VF backward_dx(const BackwardCoef& k, VF v, VF dy, VF g) {
  return hn::NegMulAdd(k.coef, v, hn::Mul(k.rstd, hn::Mul(dy, g)));  // rstd*m - coef*x
}

// The first pass of a backward row (the read from memory): its rstd and coef from the sums of
// v^2 and (dy * g) v.
template <class T, bool kFused>
BackwardCoef backward_coef(const BackwardRow<T>& r, const float* gain, int64_t hidden, float eps) {
  const DF d;
  VF sq_a = hn::Zero(d), sq_b = hn::Zero(d), mx_a = hn::Zero(d), mx_b = hn::Zero(d);
  for_each_pair(
      hidden,
      [&](int64_t i) {
        VF va, vb, dya, dyb, ga, gb;
        input_pair<T, kFused>(r, i, va, vb);
        load_pair(r.dy + i, dya, dyb);
        load_scratch(gain + i, ga, gb);
        sq_a = hn::MulAdd(va, va, sq_a);
        sq_b = hn::MulAdd(vb, vb, sq_b);
        mx_a = hn::MulAdd(hn::Mul(dya, ga), va, mx_a);
        mx_b = hn::MulAdd(hn::Mul(dyb, gb), vb, mx_b);
      },
      [&](int64_t i, size_t count) {
        const VF v = input_at<T, kFused>(r, i, count);
        sq_a = hn::MulAdd(v, v, sq_a);
        mx_a = hn::MulAdd(hn::Mul(load_n(r.dy + i, count), load_n(gain + i, count)), v, mx_a);
      });
  const float sum_sq = sum_lanes(hn::Add(sq_a, sq_b)), sum_mx = sum_lanes(hn::Add(mx_a, mx_b));
  const float rstd = 1.0f / std::sqrt(sum_sq / float(hidden) + eps);
  const float coef = rstd * rstd * rstd / float(hidden) * sum_mx;
  return BackwardCoef{hn::Set(d, rstd), hn::Set(d, coef)};
}

// The second pass of R backward rows (1 or 2) at once, from cache: dx (and dresidual), and
// dy * s * rstd added into `partial` (f32, hidden long, Note [pair order]) row after row, the
// order of one row at a time, with one load and store of the partial per R rows (Note [row
// pairs] in ops/layernorm/cpu.cpp). With streaming stores the rows take turns by blocks of
// cpu::kLineBlock columns instead (Note [line blocks], src/backends/cpu/tiling.h); the same
// sums in the same order.
template <class T, bool kFused, bool kStream, int R>
void backward_dx_rows(const BackwardRow<T> (&r)[R], const BackwardCoef (&k)[R], const float* gain, float* partial,
                      int64_t hidden) {
  if constexpr (kStream && R > 1) {  // Note [line blocks] (src/backends/cpu/tiling.h)
    for (int64_t c0 = 0; c0 < hidden; c0 += cpu::kLineBlock) {
      const int64_t n = std::min(cpu::kLineBlock, hidden - c0);
      for (int q = 0; q < R; ++q) {
        BackwardRow<T> one[1] = {r[q]};
        one[0].dy += c0, one[0].x += c0, one[0].dx += c0;
        if constexpr (kFused) one[0].ds += c0, one[0].residual += c0, one[0].dresidual += c0;
        const BackwardCoef kq[1] = {k[q]};
        backward_dx_rows<T, kFused, kStream, 1>(one, kq, gain + c0, partial + c0, n);
      }
    }
    return;
  }
  for_each_pair(
      hidden,
      [&](int64_t i) {
        VF ga, gb, pa, pb;
        load_scratch(gain + i, ga, gb);
        load_scratch(partial + i, pa, pb);
        for (int q = 0; q < R; ++q) {
          VF va, vb, dya, dyb;
          input_pair<T, kFused>(r[q], i, va, vb);
          load_pair(r[q].dy + i, dya, dyb);
          VF dxa = backward_dx(k[q], va, dya, ga), dxb = backward_dx(k[q], vb, dyb, gb);
          if constexpr (kFused) {
            VF dsa, dsb;
            load_pair(r[q].ds + i, dsa, dsb);
            dxa = hn::Add(dxa, dsa);
            dxb = hn::Add(dxb, dsb);
            store_pair<kStream>(dxa, dxb, r[q].dresidual + i);
          }
          store_pair<kStream>(dxa, dxb, r[q].dx + i);
          pa = hn::MulAdd(hn::Mul(dya, va), k[q].rstd, pa);
          pb = hn::MulAdd(hn::Mul(dyb, vb), k[q].rstd, pb);
        }
        store_scratch(pa, pb, partial + i);
      },
      [&](int64_t i, size_t count) {
        const VF g = load_n(gain + i, count);
        VF p = load_n(partial + i, count);
        for (int q = 0; q < R; ++q) {
          const VF v = input_at<T, kFused>(r[q], i, count);
          const VF dy = load_n(r[q].dy + i, count);
          VF dx = backward_dx(k[q], v, dy, g);
          if constexpr (kFused) {
            dx = hn::Add(dx, load_n(r[q].ds + i, count));
            store_n(dx, r[q].dresidual + i, count);
          }
          store_n(dx, r[q].dx + i, count);
          p = hn::MulAdd(hn::Mul(dy, v), k[q].rstd, p);
        }
        store_n(p, partial + i, count);
      });
}

template <class T, bool kFused>
BackwardRow<T> backward_row_at(const NormBackwardRows& a, int64_t row) {
  BackwardRow<T> r{};
  r.dy = static_cast<const T*>(a.dy) + row * a.dy_stride;
  r.x = static_cast<const T*>(a.x) + row * a.x_stride;
  r.dx = static_cast<T*>(a.dx) + row * a.dx_stride;
  if constexpr (kFused) {
    r.ds = static_cast<const T*>(a.ds) + row * a.ds_stride;
    r.residual = static_cast<const T*>(a.residual) + row * a.residual_stride;
    r.dresidual = static_cast<T*>(a.dresidual) + row * a.dresidual_stride;
  }
  return r;
}

// Rows two at a time through the second pass (Note [row pairs] in ops/layernorm/cpu.cpp).
template <class T, bool kFused, bool kStream>
void backward_chunk_typed(const NormBackwardRows& a, int64_t begin, int64_t end, float* partial) {
  std::fill(partial, partial + a.hidden, 0.0f);
  std::unique_ptr<float[]> gain(new float[size_t(a.hidden)]);
  gain_row(static_cast<const T*>(a.w), a.offset, gain.get(), a.hidden);
  auto rows = [&]<int R>(int64_t row) {  // rows row .. row + R - 1
    BackwardRow<T> r[R];
    BackwardCoef k[R];
    for (int q = 0; q < R; ++q) {
      r[q] = backward_row_at<T, kFused>(a, row + q);
      k[q] = backward_coef<T, kFused>(r[q], gain.get(), a.hidden, a.eps);
    }
    backward_dx_rows<T, kFused, kStream, R>(r, k, gain.get(), partial, a.hidden);
  };
  int64_t row = begin;
  for (; row + 1 < end; row += 2) rows.template operator()<2>(row);
  if (row < end) rows.template operator()<1>(row);
  if constexpr (kStream) hwy::FlushStream();
}

template <class T>
void backward_chunk_for(const NormBackwardRows& a, int64_t begin, int64_t end, float* partial) {
  if (a.residual) {
    if (a.stream) backward_chunk_typed<T, true, true>(a, begin, end, partial);
    else backward_chunk_typed<T, true, false>(a, begin, end, partial);
  } else {
    if (a.stream) backward_chunk_typed<T, false, true>(a, begin, end, partial);
    else backward_chunk_typed<T, false, false>(a, begin, end, partial);
  }
}

void norm_backward_chunk(const NormBackwardRows& a, int64_t begin, int64_t end, float* partial) {
  switch (a.dtype) {
    case DType::bf16: return backward_chunk_for<bf16_t>(a, begin, end, partial);
    case DType::f16: return backward_chunk_for<f16_t>(a, begin, end, partial);
    default: return backward_chunk_for<float>(a, begin, end, partial);
  }
}

// dw[j] = sum over chunks c, in order, of partials[c * hidden + j], for j in [begin, end). The
// partials are in Note [pair order]: begin is a multiple of the pair step (run_backward's column
// tasks are), so pair steps of dw line up with those of the rows.
template <class T>
void reduce_partials_typed(const float* partials, int64_t n_chunks, int64_t hidden, T* dw,
                           int64_t begin, int64_t end) {
  const int64_t lanes = int64_t(hn::Lanes(DF())), pairs_end = std::min(end, pair_end(hidden));
  int64_t j = begin;
  for (; j + 2 * lanes <= pairs_end; j += 2 * lanes) {
    VF sum_a = hn::Zero(DF()), sum_b = hn::Zero(DF());
    for (int64_t c = 0; c < n_chunks; ++c) {
      VF a, b;
      load_scratch(partials + c * hidden + j, a, b);
      sum_a = hn::Add(sum_a, a);
      sum_b = hn::Add(sum_b, b);
    }
    store_pair(sum_a, sum_b, dw + j);
  }
  for (; j < end; j += lanes) {
    const size_t count = size_t(std::min(lanes, end - j));
    VF sum = hn::Zero(DF());
    for (int64_t c = 0; c < n_chunks; ++c) sum = hn::Add(sum, load_n(partials + c * hidden + j, count));
    store_n(sum, dw + j, count);
  }
}

void norm_reduce_partials(const float* partials, int64_t n_chunks, int64_t hidden, DType dtype,
                          void* dw, int64_t begin, int64_t end) {
  switch (dtype) {
    case DType::bf16:
      return reduce_partials_typed(partials, n_chunks, hidden, static_cast<bf16_t*>(dw), begin, end);
    case DType::f16:
      return reduce_partials_typed(partials, n_chunks, hidden, static_cast<f16_t*>(dw), begin, end);
    default:
      return reduce_partials_typed(partials, n_chunks, hidden, static_cast<float*>(dw), begin, end);
  }
}

}  // namespace opforge::norm_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstdint>
#include <initializer_list>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace norm_cpu {
HWY_EXPORT(norm_forward_rows);
HWY_EXPORT(norm_backward_chunk);
HWY_EXPORT(norm_reduce_partials);
}  // namespace norm_cpu

namespace {

// Rows per task (forward) or per dw chunk (backward): Note [tiling] over L2, with
// `tensors_per_element` row tensors of the op's dtype touched at each element.
cpu::RowTasks row_tasks(const TensorView& x, int64_t tensors_per_element) {
  const int64_t hidden = x.size(-1);
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * x.itemsize();
  spec.multiplier = hidden;
  spec.level = cpu::CacheLevel::l2;
  return cpu::row_blocks(x.rows(), spec);
}

void run_forward(const NormForwardRows& a, const cpu::RowTasks& blocks) {
  const cpu::RowTasks tasks = cpu::balanced(blocks);  // rows are independent: Note [balanced tasks]
  auto* rows_fn = HWY_DYNAMIC_DISPATCH(norm_cpu::norm_forward_rows);
  cpu::parallel_tasks(tasks.count(),
                      [&](int64_t t) { rows_fn(a, tasks.begin(t), tasks.end(t)); });
}

// Backward: chunk partials, then the ordered reduction over columns into dw.
void run_backward(const NormBackwardRows& a, const cpu::RowTasks& tiles, const TensorView& dw) {
  const cpu::RowTasks chunks = cpu::partial_chunks(tiles);  // Note [bounded partials]
  const int64_t hidden = a.hidden, n_chunks = chunks.count();
  std::unique_ptr<float[]> partials(new float[size_t(std::max<int64_t>(n_chunks * hidden, 1))]);
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(norm_cpu::norm_backward_chunk);
  cpu::parallel_tasks(n_chunks, [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), partials.get() + c * hidden);
  });
  // Columns per reduction task: Note [tiling] with every chunk's partial in the working set.
  // A unit of columns is the widest pair step of any target, so each task starts on a pair step
  // (Note [pair order]).
  constexpr int64_t kPairUnit = 2 * HWY_MAX_BYTES / int64_t(sizeof(float));
  cpu::TileSpec spec;
  spec.bytes_per_element = int64_t(sizeof(float)) * std::max<int64_t>(n_chunks, 1);
  spec.multiplier = kPairUnit;
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks columns{hidden, kPairUnit * cpu::capacity_block(spec)};
  auto* reduce_fn = HWY_DYNAMIC_DISPATCH(norm_cpu::norm_reduce_partials);
  cpu::parallel_tasks(columns.count(), [&](int64_t t) {
    reduce_fn(partials.get(), n_chunks, hidden, a.dtype, dw.data, columns.begin(t), columns.end(t));
  });
}

// The fields every forward / backward call fills; the fused ops add theirs.
NormForwardRows forward_rows(const TensorView& y, const TensorView& x, const TensorView& w,
                             double eps, double offset) {
  NormForwardRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.offset = float(offset);
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.y = y.data;
  a.y_stride = y.row_stride();
  a.rows = x.rows();
  return a;
}

NormBackwardRows backward_rows(const TensorView& dx, const TensorView& dy, const TensorView& x,
                               const TensorView& w, double eps, double offset) {
  NormBackwardRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.offset = float(offset);
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  return a;
}

}  // namespace

const char* norm_cpu_dtype_reason(const TensorView& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

void rms_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                  double eps, double offset) {
  NormForwardRows a = forward_rows(y, x, w, eps, offset);
  a.stream = cpu::stream_outputs(2 * bytes_of(x), {&y});
  run_forward(a, row_tasks(x, 3));
}

void fused_add_rms_norm_cpu(const Context&, const TensorView& y, const TensorView& s,
                            const TensorView& x, const TensorView& residual, const TensorView& w,
                            double eps, double offset) {
  NormForwardRows a = forward_rows(y, x, w, eps, offset);
  a.residual = residual.data;
  a.residual_stride = residual.row_stride();
  a.s = s.data;
  a.s_stride = s.row_stride();
  a.stream = cpu::stream_outputs(4 * bytes_of(x), {&y, &s});
  run_forward(a, row_tasks(x, 5));
}

void rms_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                           const TensorView& dy, const TensorView& x, const TensorView& w,
                           double eps, double offset) {
  NormBackwardRows a = backward_rows(dx, dy, x, w, eps, offset);
  a.stream = cpu::stream_outputs(3 * bytes_of(x), {&dx});
  run_backward(a, row_tasks(x, 4), dw);
}

void fused_add_rms_norm_backward_cpu(const Context&, const TensorView& dx,
                                     const TensorView& dresidual, const TensorView& dw,
                                     const TensorView& dy, const TensorView& ds,
                                     const TensorView& x, const TensorView& residual,
                                     const TensorView& w, double eps, double offset) {
  NormBackwardRows a = backward_rows(dx, dy, x, w, eps, offset);
  a.ds = ds.data;
  a.ds_stride = ds.row_stride();
  a.residual = residual.data;
  a.residual_stride = residual.row_stride();
  a.dresidual = dresidual.data;
  a.dresidual_stride = dresidual.row_stride();
  a.stream = cpu::stream_outputs(6 * bytes_of(x), {&dx, &dresidual});
  run_backward(a, row_tasks(x, 7), dw);
}

const char* rms_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                    double, double) {
  return norm_cpu_dtype_reason(x);
}
const char* rms_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                             const TensorView&, const TensorView& x,
                                             const TensorView&, double, double) {
  return norm_cpu_dtype_reason(x);
}
const char* fused_add_rms_norm_cpu_applicable(const TensorView&, const TensorView&,
                                              const TensorView& x, const TensorView&,
                                              const TensorView&, double, double) {
  return norm_cpu_dtype_reason(x);
}
const char* fused_add_rms_norm_backward_cpu_applicable(
    const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
    const TensorView& x, const TensorView&, const TensorView&, double, double) {
  return norm_cpu_dtype_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
