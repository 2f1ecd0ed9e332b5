// SIMD helpers of the CPU kernels, compiled once per Highway target.
//
// Include after "hwy/foreach_target.h" (and "hwy/highway.h") in a kernel file; the per-target
// include guard below lets foreach_target re-include it for every target.
//
// Storage types are float, opforge::bf16_t and opforge::f16_t; every computation runs on f32
// vectors (ScalableTag<float>: 4 lanes on SSE4/NEON, 8 on AVX2, 16 on AVX-512).
//
// Note [vector rounding]: f32 -> bf16 / f16 stores round to nearest even exactly as dtype.h's
// scalar f32_to_bf16 / f32_to_f16 (Note [rounding]), NaN payloads included. Highway 1.0's own
// DemoteTo truncates for bf16 (and for f16 on targets without F16C), so the conversions are done
// here on the u32 bit patterns; tests/ops_norm_activation_test.cpp checks all 2^16 patterns and a
// sweep of f32 values on every target this machine runs.

#if defined(OPFORGE_BACKENDS_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_BACKENDS_CPU_SIMD_INL_H_
#undef OPFORGE_BACKENDS_CPU_SIMD_INL_H_
#else
#define OPFORGE_BACKENDS_CPU_SIMD_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "hwy/highway.h"
#include "opforge/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;
using DI = hn::RebindToSigned<DF>;
using D16 = hn::Rebind<uint16_t, DF>;

// Lanes of every vector of a buffer that holds one f32 vector of any target.
inline constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// ---- Note [vector rounding] --------------------------------------------------------------------
// bf16 bits (in the low 16 bits of each u32 lane) of v, rounded to nearest even.
HWY_INLINE VU bf16_bits(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU high = hn::ShiftRight<16>(u);
  const VU rounded = hn::ShiftRight<16>(
      hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), hn::And(high, hn::Set(du, 1u))));
  // NaN: keep it quiet (rounding could carry a low-payload NaN into infinity). An integer test:
  // Highway 1.0's float != is an ordered compare, false for NaN.
  const DI di;
  const auto abs = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu)));
  const auto is_nan = hn::RebindMask(du, hn::Gt(abs, hn::Set(di, 0x7f800000)));
  return hn::IfThenElse(is_nan, hn::Or(high, hn::Set(du, 0x40u)), rounded);
}

// f16 bits of v, rounded to nearest even; overflow to infinity, subnormals exact.
HWY_INLINE VU f16_bits(VF v) {
  const DF df;
  const DU du;
  const DI di;
  const VU u = hn::BitCast(du, v);
  const VU sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const VU abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto abs_i = hn::BitCast(di, abs);
  // Normal range: re-bias the exponent (127 -> 15), round the 13 dropped bits to nearest even.
  const VU odd = hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 1u));
  const VU normal = hn::ShiftRight<13>(
      hn::Add(hn::Sub(abs, hn::Set(du, 112u << 23)), hn::Add(hn::Set(du, 0xfffu), odd)));
  // Below 2^-14: adding 0.5f leaves a value whose f32 ulp is 2^-24, the f16 subnormal step, so
  // the f32 addition itself rounds to nearest even; the low bits are then the f16 mantissa.
  const VU subnormal =
      hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, abs), hn::Set(df, 0.5f))),
              hn::Set(du, 0x3f000000u));
  VU r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x38800000))), subnormal,
                        normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x477fefff))),
                     hn::Set(du, 0x7c00u), r);
  const VU nan = hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 0x3ffu)));
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7f800000))), nan, r);
  return hn::Or(r, sign);
}

// f16 bits (low 16 bits of each lane) to f32, exact (subnormals, infinities, NaN payloads).
HWY_INLINE VF f16_bits_to_f32(VU h) {
  const DF df;
  const DU du;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const VU shifted = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
  const VU exponent = hn::And(shifted, hn::Set(du, 0x0f800000u));
  VU o = hn::Add(shifted, hn::Set(du, 112u << 23));
  o = hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x0f800000u)), hn::Add(o, hn::Set(du, 112u << 23)),
                     o);
  // Zero / subnormal: renormalise through an exact f32 subtraction of 2^-14.
  const VU sub = hn::BitCast(du, hn::Sub(hn::BitCast(df, hn::Add(o, hn::Set(du, 1u << 23))),
                                         hn::Set(df, 6.103515625e-05f)));
  o = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du)), sub, o);
  return hn::BitCast(df, hn::Or(o, sign));
}

HWY_INLINE VF bf16_bits_to_f32(VU h) { return hn::BitCast(DF(), hn::ShiftLeft<16>(h)); }

// ---- loads and stores of one full vector -----------------------------------------------------
HWY_INLINE VF load(const float* p) { return hn::LoadU(DF(), p); }
HWY_INLINE VF load(const bf16_t* p) {
  return bf16_bits_to_f32(hn::PromoteTo(DU(), hn::LoadU(D16(), &p->bits)));
}
HWY_INLINE VF load(const f16_t* p) {
  return f16_bits_to_f32(hn::PromoteTo(DU(), hn::LoadU(D16(), &p->bits)));
}

HWY_INLINE void store(VF v, float* p) { hn::StoreU(v, DF(), p); }
HWY_INLINE void store(VF v, bf16_t* p) {
  hn::StoreU(hn::DemoteTo(D16(), hn::BitCast(DI(), bf16_bits(v))), D16(), &p->bits);
}
HWY_INLINE void store(VF v, f16_t* p) {
  hn::StoreU(hn::DemoteTo(D16(), hn::BitCast(DI(), f16_bits(v))), D16(), &p->bits);
}

// v rounded to T and widened back: the value a store of v to T and a load would give.
template <class T> HWY_INLINE VF round_to(VF v) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_bits_to_f32(bf16_bits(v));
  if constexpr (std::is_same_v<T, f16_t>) return f16_bits_to_f32(f16_bits(v));
  return v;
}

// ---- loads and stores of count <= Lanes elements (row tails) ------------------------------------
// The tail goes through a zeroed buffer, so lanes past `count` are +0 and add nothing to sums.
template <class T> HWY_INLINE VF load_n(const T* p, size_t count) {
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return load(p);
  alignas(64) T buffer[kMaxLanes];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), p, count * sizeof(T));
  return load(buffer);
}

template <class T> HWY_INLINE void store_n(VF v, T* p, size_t count) {
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return store(v, p);
  alignas(64) T buffer[kMaxLanes];
  store(v, buffer);
  std::memcpy(static_cast<void*>(p), buffer, count * sizeof(T));
}

HWY_INLINE float sum_lanes(VF v) { return hn::GetLane(hn::SumOfLanes(DF(), v)); }

// 1 / v to within an ulp or two of f32 for normal, finite v (not 0, not inf: the Newton step
// would give NaN), faster than a divide: the hardware estimate (8 bits on NEON, 12 on AVX2, 14 on
// AVX-512; exact on EMU128/SCALAR) refined by Newton steps r' = r + r (1 - v r), each doubling
// the correct bits. Two steps give at least 32 bits on every target, past f32's 24, so 1 / 1 is
// exactly 1 and silu(a) of a large a is exactly a, as the reference gives.
HWY_INLINE VF reciprocal(VF v) {
  const VF one = hn::Set(DF(), 1.0f);
  VF r = hn::ApproximateReciprocal(v);
  r = hn::MulAdd(r, hn::NegMulAdd(v, r, one), r);
  return hn::MulAdd(r, hn::NegMulAdd(v, r, one), r);
}

// ---- loops over one row ----------------------------------------------------------------------
// body(i, count) for i = 0, N, 2N, ... < n with count = min(N, n - i).
template <class Body> HWY_INLINE void for_each_vector(int64_t n, Body&& body) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(i, size_t(lanes));
  if (i < n) body(i, size_t(n - i));
}

// gain[i] = w[i] + offset in f32, for i in [0, n): the per-column factor of the norm ops,
// converted once per task instead of once per row.
template <class T> HWY_INLINE void gain_row(const T* w, float offset, float* gain, int64_t n) {
  const VF voff = hn::Set(DF(), offset);
  for_each_vector(n, [&](int64_t i, size_t count) {
    store_n(hn::Add(load_n(w + i, count), voff), gain + i, count);
  });
}

// Sum over a row: term(i, count, acc) adds lanes [i, i + count) into acc. Two accumulators
// alternate so that consecutive multiply-adds do not wait on each other.
template <class Term> HWY_INLINE float sum_over(int64_t n, Term&& term) {
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  VF acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    term(i, size_t(lanes), acc0);
    term(i + lanes, size_t(lanes), acc1);
  }
  for (; i < n; i += lanes) term(i, size_t(std::min(lanes, n - i)), acc0);
  return sum_lanes(hn::Add(acc0, acc1));
}

// Two sums over a row at once: term(i, count, acc_a, acc_b).
template <class Term> HWY_INLINE std::pair<float, float> sum_over2(int64_t n, Term&& term) {
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), b0 = hn::Zero(d), b1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    term(i, size_t(lanes), a0, b0);
    term(i + lanes, size_t(lanes), a1, b1);
  }
  for (; i < n; i += lanes) term(i, size_t(std::min(lanes, n - i)), a0, b0);
  return {sum_lanes(hn::Add(a0, a1)), sum_lanes(hn::Add(b0, b1))};
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
