// CPU kernels of rms_norm_gated and poly_norm (and their backward ops).
//
// Assumes: Note [row layout], f32 / bf16 / f16 (f64 goes to the reference kernel), the op's check
// has run (group_size divides hidden, the activation name is known).
//
// Why it is fast:
// - Highway SIMD with runtime dispatch; rows in natural order (load_n / store_n), bf16 / f16
//   widened to f32 in registers and rounded once on the store (Note [vector rounding]).
// - One read of each row from memory: pass 1 (the sums) pulls the row into L1/L2, pass 2 re-reads
//   it from there. rms_norm_gated evaluates the gate once per element in pass 1 and keeps u and
//   act(z) in an f32 scratch row that pass 2 reads back; its backward recomputes them instead
//   (one exp per element and pass), which costs less than two more scratch rows would.
// - poly_norm: the three sums of squares (x^2, x^4, x^6) in one pass, then y by Horner's rule
//   with the per-row coefficients w_p * rstd_p folded in: 3 multiply-adds per element.
// - Past the cache share (Note [streaming stores]) y of rms_norm_gated and poly_norm and dx of
//   poly_norm_backward leave by non-temporal stores; poly_norm's second passes (forward and
//   backward) prefetch the next row for the first (Note [row prefetch]).
// - OpenMP over tasks of rows sized by capacity_block (Note [tiling]); dw / db of the backward ops
//   are reduced per chunk of rows (a fixed count from Note [tiling]) and the chunk partials added
//   in chunk order: deterministic and independent of the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/norm/cpu_variants.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/activation/functors-inl.h"
#include "ops/norm/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::norm_variants_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// sigmoid(a) from e = exp(-|a|) in (0, 1]: no overflow, and 1 + e in [1, 2] where the refined
// reciprocal is good to an ulp or two.
HWY_INLINE VF sigmoid(VF a) {
  const DF d;
  const VF e = hn::Exp(d, hn::Neg(hn::Abs(a)));
  const VF r = reciprocal(hn::Add(hn::Set(d, 1.0f), e));
  return hn::IfThenElse(hn::Lt(a, hn::Zero(d)), hn::Mul(e, r), r);
}

// The gate's sigmoid for a kernel whose outputs are T: f32 as above; bf16 / f16 with the
// activations' reduced math (Note [output precision], ops/activation/functors-inl.h: a low-degree
// base-2 exponential and the reciprocal estimate with one Newton step, relative error below 1e-4,
// a twentieth of a bf16 half ulp), which is most of these kernels' arithmetic.
template <class T> HWY_INLINE VF sigmoid_for(VF a) {
  namespace act = opforge::activation_cpu::HWY_NAMESPACE;
  if constexpr (std::is_same_v<T, float>) return sigmoid(a);
  else return act::sigmoid<act::MathFor<T>>(a);
}

// act(z) and act'(z) of the gate.
struct GateV {
  VF value, slope;
};
template <class T> HWY_INLINE GateV gate(VF z, bool sigmoid_gate) {
  const VF s = sigmoid_for<T>(z), one = hn::Set(DF(), 1.0f);
  const VF one_minus_s = hn::Sub(one, s);
  if (sigmoid_gate) return {s, hn::Mul(s, one_minus_s)};
  return {hn::Mul(z, s), hn::Mul(s, hn::MulAdd(z, one_minus_s, one))};  // silu
}
template <class T> HWY_INLINE VF gate_value(VF z, bool sigmoid_gate) {
  const VF s = sigmoid_for<T>(z);
  return sigmoid_gate ? s : hn::Mul(z, s);
}

// w widened to f32 in natural order (these kernels do not use Note [pair order]).
template <class T> void widen_row(const T* w, float* out, int64_t n) {
  for_each_vector(n, [&](int64_t i, size_t count) { store_n(load_n(w + i, count), out + i, count); });
}

// ---- rms_norm_gated ---------------------------------------------------------------------------
// One forward row. Pass 1 per group: u = x * act(z) (or x), sum of u^2; u (and act(z) when the
// norm comes first) go to the scratch rows. Pass 2: y = u * rstd * w (* act(z) when the norm comes
// first). y may alias x: pass 2 does not read x. kStream: pass 2 writes y's whole vectors that
// start on a vector of their own bytes by non-temporal stores (Note [streaming stores]; a group
// of any size may start off that boundary, so the test is per vector), the rest by plain stores.
template <class T, bool kStream>
void gated_forward_row(const GatedNormRows& a, const T* x, const T* z, const float* gain, T* y,
                       float* u_row, float* act_row) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  const uintptr_t vector_bytes = uintptr_t(lanes * sizeof(T));
  for (int64_t start = 0; start < a.hidden; start += a.group) {
    VF acc = hn::Zero(d);
    for_each_vector(a.group, [&](int64_t k, size_t count) {
      const int64_t i = start + k;
      const VF xv = load_n(x + i, count), act = gate_value<T>(load_n(z + i, count), a.sigmoid_gate);
      const VF u = a.norm_before_gate ? xv : hn::Mul(xv, act);
      acc = hn::MulAdd(u, u, acc);
      store_n(u, u_row + i, count);
      if (a.norm_before_gate) store_n(act, act_row + i, count);
    });
    const float rstd = 1.0f / std::sqrt(sum_lanes(acc) / float(a.group) + a.eps);
    const VF vr = hn::Set(d, rstd);
    for_each_vector(a.group, [&](int64_t k, size_t count) {
      const int64_t i = start + k;
      VF out = hn::Mul(hn::Mul(load_n(u_row + i, count), vr), load_n(gain + i, count));
      if (a.norm_before_gate) out = hn::Mul(out, load_n(act_row + i, count));
      if constexpr (kStream) {
        if (count == lanes && reinterpret_cast<uintptr_t>(y + i) % vector_bytes == 0) return store<true>(out, y + i);
      }
      store_n(out, y + i, count);
    });
  }
}

template <class T, bool kStream> void gated_forward_typed(const GatedNormRows& a, int64_t begin, int64_t end) {
  const size_t n = size_t(a.hidden);
  std::unique_ptr<float[]> scratch(new float[3 * n]);
  float *gain = scratch.get(), *u_row = gain + n, *act_row = u_row + n;
  widen_row(static_cast<const T*>(a.w), gain, a.hidden);
  for (int64_t row = begin; row < end; ++row) {
    gated_forward_row<T, kStream>(a, static_cast<const T*>(a.x) + row * a.x_stride,
                                  static_cast<const T*>(a.z) + row * a.z_stride, gain,
                                  static_cast<T*>(a.y) + row * a.y_stride, u_row, act_row);
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T> void gated_forward_for(const GatedNormRows& a, int64_t begin, int64_t end) {
  if (a.stream) gated_forward_typed<T, true>(a, begin, end);
  else gated_forward_typed<T, false>(a, begin, end);
}

void gated_forward_rows(const GatedNormRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return gated_forward_for<bf16_t>(a, begin, end);
    case DType::f16: return gated_forward_for<f16_t>(a, begin, end);
    default: return gated_forward_for<float>(a, begin, end);
  }
}

// The lanes of one backward step: u (what is normalised), dn (its upstream gradient), the gate.
struct GatedLanes {
  VF x, u, dy, dn;
  GateV g;
};
template <class T>
HWY_INLINE GatedLanes gated_lanes(const GatedNormRows& a, const T* x, const T* z, const T* dy,
                                  int64_t i, size_t count) {
  GatedLanes l;
  l.x = load_n(x + i, count);
  l.g = gate<T>(load_n(z + i, count), a.sigmoid_gate);
  l.dy = load_n(dy + i, count);
  l.u = a.norm_before_gate ? l.x : hn::Mul(l.x, l.g.value);
  l.dn = a.norm_before_gate ? hn::Mul(l.dy, l.g.value) : l.dy;
  return l;
}

template <class T>
void gated_backward_row(const GatedNormRows& a, const T* x, const T* z, const T* dy, const float* gain,
                        T* dx, T* dz, float* partial) {
  const DF d;
  for (int64_t start = 0; start < a.hidden; start += a.group) {
    VF sq = hn::Zero(d), mu = hn::Zero(d);
    for_each_vector(a.group, [&](int64_t k, size_t count) {
      const int64_t i = start + k;
      const GatedLanes l = gated_lanes(a, x, z, dy, i, count);
      sq = hn::MulAdd(l.u, l.u, sq);
      mu = hn::MulAdd(hn::Mul(l.dn, load_n(gain + i, count)), l.u, mu);
    });
    const float rstd = 1.0f / std::sqrt(sum_lanes(sq) / float(a.group) + a.eps);
    const float coef = rstd * rstd * rstd / float(a.group) * sum_lanes(mu);
    const VF vr = hn::Set(d, rstd), vc = hn::Set(d, coef);
    for_each_vector(a.group, [&](int64_t k, size_t count) {
      const int64_t i = start + k;
      const GatedLanes l = gated_lanes(a, x, z, dy, i, count);
      const VF g = load_n(gain + i, count);
      const VF du = hn::NegMulAdd(vc, l.u, hn::Mul(vr, hn::Mul(l.dn, g)));  // r*m - coef*u
      const VF ur = hn::Mul(l.u, vr);
      if (a.norm_before_gate) {
        store_n(du, dx + i, count);
        store_n(hn::Mul(hn::Mul(l.dy, hn::Mul(ur, g)), l.g.slope), dz + i, count);
      } else {
        store_n(hn::Mul(du, l.g.value), dx + i, count);
        store_n(hn::Mul(hn::Mul(du, l.x), l.g.slope), dz + i, count);
      }
      store_n(hn::MulAdd(l.dn, ur, load_n(partial + i, count)), partial + i, count);
    });
  }
}

template <class T>
void gated_backward_typed(const GatedNormRows& a, int64_t begin, int64_t end, float* partial) {
  std::fill(partial, partial + a.hidden, 0.0f);
  std::unique_ptr<float[]> gain(new float[size_t(a.hidden)]);
  widen_row(static_cast<const T*>(a.w), gain.get(), a.hidden);
  for (int64_t row = begin; row < end; ++row) {
    gated_backward_row<T>(a, static_cast<const T*>(a.x) + row * a.x_stride,
                          static_cast<const T*>(a.z) + row * a.z_stride,
                          static_cast<const T*>(a.dy) + row * a.dy_stride, gain.get(),
                          static_cast<T*>(a.dx) + row * a.dx_stride,
                          static_cast<T*>(a.dz) + row * a.dz_stride, partial);
  }
}

void gated_backward_chunk(const GatedNormRows& a, int64_t begin, int64_t end, float* partial) {
  switch (a.dtype) {
    case DType::bf16: return gated_backward_typed<bf16_t>(a, begin, end, partial);
    case DType::f16: return gated_backward_typed<f16_t>(a, begin, end, partial);
    default: return gated_backward_typed<float>(a, begin, end, partial);
  }
}

// dw[j] = sum over chunks, in order, of partials[c * hidden + j], j in [begin, end); natural order.
template <class T>
void reduce_typed(const float* partials, int64_t n_chunks, int64_t hidden, T* dw, int64_t begin,
                  int64_t end) {
  for_each_vector(end - begin, [&](int64_t k, size_t count) {
    const int64_t j = begin + k;
    VF sum = hn::Zero(DF());
    for (int64_t c = 0; c < n_chunks; ++c) sum = hn::Add(sum, load_n(partials + c * hidden + j, count));
    store_n(sum, dw + j, count);
  });
}

void reduce_columns(const float* partials, int64_t n_chunks, int64_t hidden, DType dtype, void* dw,
                    int64_t begin, int64_t end) {
  switch (dtype) {
    case DType::bf16:
      return reduce_typed(partials, n_chunks, hidden, static_cast<bf16_t*>(dw), begin, end);
    case DType::f16:
      return reduce_typed(partials, n_chunks, hidden, static_cast<f16_t*>(dw), begin, end);
    default: return reduce_typed(partials, n_chunks, hidden, static_cast<float*>(dw), begin, end);
  }
}

// ---- poly_norm --------------------------------------------------------------------------------
// K sums over a row of n elements, in f32 within blocks of kBlockVectors vectors and in double
// across blocks: sums of x^6 over rows with outliers lose too many bits in plain f32 running sums.
// term(i, count, acc) adds lanes [i, i + count) into the K f32 accumulators acc.
constexpr int64_t kBlockVectors = 16;
template <int K, class Term> HWY_INLINE void blocked_sums(int64_t n, double (&out)[K], Term&& term) {
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d)), block = kBlockVectors * lanes;
  for (int k = 0; k < K; ++k) out[k] = 0;
  for (int64_t start = 0; start < n; start += block) {
    VF acc[K];
    for (int k = 0; k < K; ++k) acc[k] = hn::Zero(d);
    const int64_t end = std::min(n, start + block);
    for (int64_t i = start; i < end; i += lanes) term(i, size_t(std::min(lanes, end - i)), acc);
    for (int k = 0; k < K; ++k) out[k] += double(sum_lanes(acc[k]));
  }
}

// rstd_p = 1 / sqrt(mean(x^(2p)) + eps) for p = 1, 2, 3 from the sums of x^2, x^4, x^6.
struct PolyRstd {
  float r1, r2, r3;
};
inline PolyRstd poly_rstd(double s2, double s4, double s6, int64_t hidden, float eps) {
  const double n = double(hidden);
  return {float(1.0 / std::sqrt(s2 / n + eps)), float(1.0 / std::sqrt(s4 / n + eps)),
          float(1.0 / std::sqrt(s6 / n + eps))};
}

// Pass 2 goes in pair steps (Note [pair order]: element-wise, so the order is free) so that it can
// prefetch the next row of 16-bit data (Note [row prefetch]) and, past the cache share, write y
// by streaming stores (Note [streaming stores]).
template <class T, bool kStream> void poly_forward_typed(const PolyRows& a, int64_t begin, int64_t end) {
  const DF d;
  constexpr bool kPrefetch = sizeof(T) == 2;
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* next_x = row + 1 < a.rows ? x + a.x_stride : x;
    T* y = static_cast<T*>(a.y) + row * a.y_stride;
    double s[3];  // sums of x^2, x^4, x^6
    blocked_sums<3>(a.hidden, s, [&](int64_t i, size_t count, VF(&acc)[3]) {
      const VF v = load_n(x + i, count), v2 = hn::Mul(v, v), v3 = hn::Mul(v2, v);
      acc[0] = hn::MulAdd(v, v, acc[0]);
      acc[1] = hn::MulAdd(v2, v2, acc[1]);
      acc[2] = hn::MulAdd(v3, v3, acc[2]);
    });
    const PolyRstd r = poly_rstd(s[0], s[1], s[2], a.hidden, a.eps);
    // y = ((c3 x + c2) x + c1) x + b with c_p = w_p * rstd_p.
    const VF c3 = hn::Set(d, a.w[0] * r.r3), c2 = hn::Set(d, a.w[1] * r.r2);
    const VF c1 = hn::Set(d, a.w[2] * r.r1), bias = hn::Set(d, a.b);
    auto poly = [&](VF v) { return hn::MulAdd(hn::MulAdd(hn::MulAdd(c3, v, c2), v, c1), v, bias); };
    for_each_pair(
        a.hidden,
        [&](int64_t i) {
          if constexpr (kPrefetch) prefetch_step(next_x + i);
          VF va, vb;
          load_pair(x + i, va, vb);
          store_pair<kStream>(poly(va), poly(vb), y + i);
        },
        [&](int64_t i, size_t count) { store_n(poly(load_n(x + i, count)), y + i, count); });
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <bool kStream> void poly_forward_for(const PolyRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return poly_forward_typed<bf16_t, kStream>(a, begin, end);
    case DType::f16: return poly_forward_typed<f16_t, kStream>(a, begin, end);
    default: return poly_forward_typed<float, kStream>(a, begin, end);
  }
}

void poly_forward_rows(const PolyRows& a, int64_t begin, int64_t end) {
  if (a.stream) poly_forward_for<true>(a, begin, end);
  else poly_forward_for<false>(a, begin, end);
}

// One backward row: dx, and the row's r_p * S_p and sum(dy) added to `partial`. Pass 2 goes in
// pair steps like the forward's: it prefetches the next row of x and dy for pass 1 (16-bit data,
// Note [row prefetch]) and, past the cache share, writes dx by streaming stores (kStream).
template <class T, bool kStream>
void poly_backward_row(const PolyRows& a, const T* x, const T* dy, T* dx, const T* next_x, const T* next_dy,
                       PolyPartial& partial) {
  constexpr bool kPrefetch = sizeof(T) == 2;
  const DF d;
  double q[7];  // sums of x^2, x^4, x^6, dy x, dy x^2, dy x^3, dy
  blocked_sums<7>(a.hidden, q, [&](int64_t i, size_t count, VF(&acc)[7]) {
    const VF v = load_n(x + i, count), g = load_n(dy + i, count);
    const VF v2 = hn::Mul(v, v), v3 = hn::Mul(v2, v);
    acc[0] = hn::MulAdd(v, v, acc[0]);
    acc[1] = hn::MulAdd(v2, v2, acc[1]);
    acc[2] = hn::MulAdd(v3, v3, acc[2]);
    acc[3] = hn::MulAdd(g, v, acc[3]);
    acc[4] = hn::MulAdd(g, v2, acc[4]);
    acc[5] = hn::MulAdd(g, v3, acc[5]);
    acc[6] = hn::Add(acc[6], g);
  });
  const PolyRstd r = poly_rstd(q[0], q[1], q[2], a.hidden, a.eps);
  const float s1 = float(q[3]), s2 = float(q[4]), s3 = float(q[5]), n = float(a.hidden);
  partial.dw[1] += double(r.r1) * q[3];
  partial.dw[2] += double(r.r2) * q[4];
  partial.dw[3] += double(r.r3) * q[5];
  partial.db += q[6];
  // dx = dy * (A1 + A2 x + A3 x^2) - (B1 x + B2 x^3 + B3 x^5), A_p = w_p p r_p,
  // B_p = w_p (p / n) r_p^3 S_p.
  const float w1 = a.w[2], w2 = a.w[1], w3 = a.w[0];
  const VF a1 = hn::Set(d, w1 * r.r1), a2 = hn::Set(d, w2 * 2 * r.r2), a3 = hn::Set(d, w3 * 3 * r.r3);
  const VF b1 = hn::Set(d, w1 / n * r.r1 * r.r1 * r.r1 * s1);
  const VF b2 = hn::Set(d, w2 * 2 / n * r.r2 * r.r2 * r.r2 * s2);
  const VF b3 = hn::Set(d, w3 * 3 / n * r.r3 * r.r3 * r.r3 * s3);
  auto grad = [&](VF v, VF g) {
    const VF v2 = hn::Mul(v, v);
    const VF up = hn::Mul(g, hn::MulAdd(hn::MulAdd(a3, v, a2), v, a1));
    const VF down = hn::Mul(v, hn::MulAdd(hn::MulAdd(b3, v2, b2), v2, b1));
    return hn::Sub(up, down);
  };
  for_each_pair(
      a.hidden,
      [&](int64_t i) {
        if constexpr (kPrefetch) {
          prefetch_step(next_x + i);
          prefetch_step(next_dy + i);
        }
        VF va, vb, ga, gb;
        load_pair(x + i, va, vb);
        load_pair(dy + i, ga, gb);
        store_pair<kStream>(grad(va, ga), grad(vb, gb), dx + i);
      },
      [&](int64_t i, size_t count) { store_n(grad(load_n(x + i, count), load_n(dy + i, count)), dx + i, count); });
}

template <class T, bool kStream>
void poly_backward_typed(const PolyRows& a, int64_t begin, int64_t end, PolyPartial* partial) {
  *partial = PolyPartial{};
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* dy = static_cast<const T*>(a.dy) + row * a.dy_stride;
    const bool last = row + 1 >= a.rows;
    poly_backward_row<T, kStream>(a, x, dy, static_cast<T*>(a.dx) + row * a.dx_stride, last ? x : x + a.x_stride,
                                  last ? dy : dy + a.dy_stride, *partial);
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <bool kStream> void poly_backward_for(const PolyRows& a, int64_t begin, int64_t end, PolyPartial* partial) {
  switch (a.dtype) {
    case DType::bf16: return poly_backward_typed<bf16_t, kStream>(a, begin, end, partial);
    case DType::f16: return poly_backward_typed<f16_t, kStream>(a, begin, end, partial);
    default: return poly_backward_typed<float, kStream>(a, begin, end, partial);
  }
}

void poly_backward_chunk(const PolyRows& a, int64_t begin, int64_t end, PolyPartial* partial) {
  if (a.stream) poly_backward_for<true>(a, begin, end, partial);
  else poly_backward_for<false>(a, begin, end, partial);
}

}  // namespace opforge::norm_variants_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace norm_variants_cpu {
HWY_EXPORT(gated_forward_rows);
HWY_EXPORT(gated_backward_chunk);
HWY_EXPORT(reduce_columns);
HWY_EXPORT(poly_forward_rows);
HWY_EXPORT(poly_backward_chunk);
}  // namespace norm_variants_cpu

namespace {

// Rows per task or per reduction chunk: Note [tiling] over L2 with `bytes_per_element` bytes
// touched at each element of a row (row tensors plus f32 scratch).
cpu::RowTasks row_tasks(const TensorView& x, int64_t bytes_per_element) {
  cpu::TileSpec spec;
  spec.bytes_per_element = bytes_per_element;
  spec.multiplier = x.size(-1);
  spec.level = cpu::CacheLevel::l2;
  return {x.rows(), cpu::capacity_block(spec)};
}

float scalar_at(const TensorView& t, int64_t i) { return float(load_as_double(t.data, t.dtype, i)); }

GatedNormRows gated_norm_rows(const TensorView& x, const TensorView& z, const TensorView& w, double eps,
                     int64_t group_size, bool norm_before_gate, std::string_view activation) {
  GatedNormRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.group = gate_group(a.hidden, group_size);
  a.eps = float(eps);
  a.norm_before_gate = norm_before_gate;
  GateActivation act = GateActivation::silu;
  parse_gate_activation(activation, act);
  a.sigmoid_gate = act == GateActivation::sigmoid;
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.z = z.data;
  a.z_stride = z.row_stride();
  a.w = w.data;
  return a;
}

PolyRows poly_rows(const TensorView& x, const TensorView& w, double eps) {
  PolyRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  for (int p = 0; p < 3; ++p) a.w[p] = scalar_at(w, p);
  a.x = x.data;
  a.x_stride = x.row_stride();
  return a;
}

}  // namespace

void rms_norm_gated_cpu(const Context&, const TensorView& y, const TensorView& x,
                        const TensorView& z, const TensorView& w, double eps, int64_t group_size,
                        bool norm_before_gate, std::string_view activation) {
  GatedNormRows a = gated_norm_rows(x, z, w, eps, group_size, norm_before_gate, activation);
  a.y = y.data;
  a.y_stride = y.row_stride();
  a.stream = cpu::stream_outputs(3 * bytes_of(x), {&y});
  // x, z, y of the dtype, u and act(z) in f32 scratch.
  const cpu::RowTasks tasks = row_tasks(x, 3 * x.itemsize() + 8);
  auto* fn = HWY_DYNAMIC_DISPATCH(norm_variants_cpu::gated_forward_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(a, tasks.begin(t), tasks.end(t)); });
}

void rms_norm_gated_backward_cpu(const Context&, const TensorView& dx, const TensorView& dz,
                                 const TensorView& dw, const TensorView& dy, const TensorView& x,
                                 const TensorView& z, const TensorView& w, double eps,
                                 int64_t group_size, bool norm_before_gate,
                                 std::string_view activation) {
  GatedNormRows a = gated_norm_rows(x, z, w, eps, group_size, norm_before_gate, activation);
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  a.dz = dz.data;
  a.dz_stride = dz.row_stride();
  const int64_t hidden = a.hidden;
  // dy, x, z in; dx, dz out; Note [bounded partials].
  const cpu::RowTasks chunks = cpu::partial_chunks(row_tasks(x, 5 * x.itemsize()));
  const int64_t n_chunks = chunks.count();
  std::unique_ptr<float[]> partials(new float[size_t(std::max<int64_t>(n_chunks * hidden, 1))]);
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(norm_variants_cpu::gated_backward_chunk);
  cpu::parallel_tasks(n_chunks, [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), partials.get() + c * hidden);
  });
  cpu::TileSpec spec;  // columns per reduction task: every chunk's partial in the working set
  spec.bytes_per_element = int64_t(sizeof(float)) * std::max<int64_t>(n_chunks, 1);
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks columns{hidden, cpu::capacity_block(spec)};  // no rows: dw = 0
  auto* reduce_fn = HWY_DYNAMIC_DISPATCH(norm_variants_cpu::reduce_columns);
  cpu::parallel_tasks(columns.count(), [&](int64_t t) {
    reduce_fn(partials.get(), n_chunks, hidden, a.dtype, dw.data, columns.begin(t), columns.end(t));
  });
}

void poly_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                   const TensorView& b, double eps) {
  PolyRows a = poly_rows(x, w, eps);
  a.b = scalar_at(b, 0);
  a.y = y.data;
  a.y_stride = y.row_stride();
  a.rows = x.rows();
  a.stream = cpu::stream_outputs(2 * bytes_of(x), {&y});
  const cpu::RowTasks tasks = row_tasks(x, 2 * x.itemsize());
  auto* fn = HWY_DYNAMIC_DISPATCH(norm_variants_cpu::poly_forward_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(a, tasks.begin(t), tasks.end(t)); });
}

void poly_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                            const TensorView& db, const TensorView& dy, const TensorView& x,
                            const TensorView& w, double eps) {
  PolyRows a = poly_rows(x, w, eps);
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  a.rows = x.rows();
  a.stream = cpu::stream_outputs(3 * bytes_of(x), {&dx});
  const cpu::RowTasks chunks = row_tasks(x, 3 * x.itemsize());
  std::vector<PolyPartial> partials(size_t(chunks.count()));
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(norm_variants_cpu::poly_backward_chunk);
  cpu::parallel_tasks(chunks.count(), [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), &partials[size_t(c)]);
  });
  PolyPartial total;
  for (const PolyPartial& p : partials) {  // chunk order: deterministic
    for (int k = 1; k <= 3; ++k) total.dw[k] += p.dw[k];
    total.db += p.db;
  }
  for (int k = 0; k < 3; ++k) store_from_double(dw.data, dw.dtype, k, total.dw[3 - k]);
  store_from_double(db.data, db.dtype, 0, total.db);
}

const char* rms_norm_gated_cpu_applicable(const TensorView&, const TensorView& x,
                                          const TensorView&, const TensorView&, double, int64_t,
                                          bool, std::string_view) {
  return norm_cpu_dtype_reason(x);
}
const char* rms_norm_gated_backward_cpu_applicable(const TensorView&, const TensorView&,
                                                   const TensorView&, const TensorView&,
                                                   const TensorView& x, const TensorView&,
                                                   const TensorView&, double, int64_t, bool,
                                                   std::string_view) {
  return norm_cpu_dtype_reason(x);
}
const char* poly_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                     const TensorView&, double) {
  return norm_cpu_dtype_reason(x);
}
const char* poly_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView&,
                                              const TensorView& x, const TensorView&, double) {
  return norm_cpu_dtype_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
