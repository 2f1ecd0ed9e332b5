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

#include "hwy/cache_control.h"
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
using DH = hn::Rebind<hwy::float16_t, DF>;

// x86 targets from AVX2 up have F16C: hardware f16 <-> f32 conversions that round like
// dtype.h's scalar ones (checked on every target by tests/ops_norm_activation_test.cpp).
#undef OPFORGE_HWY_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define OPFORGE_HWY_F16C 1
#else
#define OPFORGE_HWY_F16C 0
#endif

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
#if OPFORGE_HWY_F16C
  // F16C widens exactly, except that it quiets signalling NaNs: NaN lanes take the bit path.
  const VF v = hn::PromoteTo(DF(), hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(p)));
  if (HWY_LIKELY(hn::AllFalse(DF(), hn::IsNaN(v)))) return v;
#endif
  return f16_bits_to_f32(hn::PromoteTo(DU(), hn::LoadU(D16(), &p->bits)));
}

// kStream: a non-temporal store (Note [streaming stores]); p must be aligned to the vector.
template <bool kStream, class D, class V, class P> HWY_INLINE void put(V v, D d, P* p) {
  if constexpr (kStream) hn::Stream(v, d, p);
  else hn::StoreU(v, d, p);
}

template <bool kStream = false> HWY_INLINE void store(VF v, float* p) { put<kStream>(v, DF(), p); }
template <bool kStream = false> HWY_INLINE void store(VF v, bf16_t* p) {
  put<kStream>(hn::DemoteTo(D16(), hn::BitCast(DI(), bf16_bits(v))), D16(), &p->bits);
}
template <bool kStream = false> HWY_INLINE void store(VF v, f16_t* p) {
#if OPFORGE_HWY_F16C
  // F16C rounds to nearest even (subnormals, overflow and NaN as f16_bits); one instruction.
  put<kStream>(hn::DemoteTo(DH(), v), DH(), reinterpret_cast<hwy::float16_t*>(p));
#else
  put<kStream>(hn::DemoteTo(D16(), hn::BitCast(DI(), f16_bits(v))), D16(), &p->bits);
#endif
}

// The bf16 of v (rounded to nearest even) in the upper 16 bits of each lane, for v not NaN; the
// lower 16 bits are left over from the rounding.
HWY_INLINE VU bf16_round_high(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  return hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
}

// v rounded to T and widened back: the value a store of v to T and a load would give.
template <class T> HWY_INLINE VF round_to(VF v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const DU du;
    const VU high = hn::Set(du, 0xffff0000u);
    const VU quiet_nan = hn::Or(hn::And(hn::BitCast(du, v), high), hn::Set(du, 0x00400000u));
    return hn::BitCast(DF(), hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan,
                                            hn::And(bf16_round_high(v), high)));
  }
  if constexpr (std::is_same_v<T, f16_t>) {
#if OPFORGE_HWY_F16C
    return hn::PromoteTo(DF(), hn::DemoteTo(DH(), v));
#else
    return f16_bits_to_f32(f16_bits(v));
#endif
  }
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

// ---- Note [pair order] ------------------------------------------------------------------------
// Pair loops move 2 N elements per step (N = Lanes) as two f32 vectors a, b. Which element lands
// in which lane depends on the storage type: for f32 and f16, a = elements [0, N) and b = [N, 2N);
// for bf16, a = the odd elements and b = the even ones, because one 32-bit load then splits the
// bf16 pairs with an and and a shift, and a store joins them with one blend: no pack and no
// cross-lane permute (both costly on targets that split 256-bit vectors, e.g. Zen 1). Element-wise
// code does not care about the order as long as every row of one call uses the same one: f32
// scratch rows (a norm's gain, dw partials) are written as plain a, b vectors from pair loads of
// the op's dtype, so they follow it. Row tails (n % 2N elements) use load_n / store_n, natural
// order. The SCALAR target (one lane) always uses the natural order.
template <class T> HWY_INLINE void load_pair(const T* p, VF& a, VF& b) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16_t>) {
    const DU du;
    const VU u = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
    a = hn::BitCast(DF(), hn::And(u, hn::Set(du, 0xffff0000u)));
    b = hn::BitCast(DF(), hn::ShiftLeft<16>(u));
  } else
#endif
  {
    a = load(p);
    b = load(p + hn::Lanes(DF()));
  }
}

// Stores a, b in pair order, rounding to nearest even (Note [vector rounding]). kStream: p is
// aligned to the pair step's bytes (Note [streaming stores]).
template <bool kStream = false, class T> HWY_INLINE void store_pair(VF a, VF b, T* p) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16_t>) {
    const DF df;
    VU odd, even;
    if (HWY_LIKELY(hn::AllFalse(df, hn::Or(hn::IsNaN(a), hn::IsNaN(b))))) {
      odd = bf16_round_high(a);
      even = hn::ShiftRight<16>(bf16_round_high(b));
    } else {
      odd = hn::ShiftLeft<16>(bf16_bits(a));
      even = bf16_bits(b);
    }
    const hn::Repartition<uint16_t, DF> d16;
    put<kStream>(hn::OddEven(hn::BitCast(d16, odd), hn::BitCast(d16, even)), d16, &p->bits);
  } else
#endif
  {
    store<kStream>(a, p);
    store<kStream>(b, p + hn::Lanes(DF()));
  }
}

// Stores a, b in pair order like store_pair, for lanes known not to hold NaN: the bf16 rounding
// then needs no NaN test (Note [vector rounding]; infinities round to themselves).
template <bool kStream, class T> HWY_INLINE void store_pair_no_nan(VF a, VF b, T* p) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16_t>) {
    const hn::Repartition<uint16_t, DF> d16;
    const VU odd = bf16_round_high(a), even = hn::ShiftRight<16>(bf16_round_high(b));
    put<kStream>(hn::OddEven(hn::BitCast(d16, odd), hn::BitCast(d16, even)), d16, &p->bits);
    return;
  }
#endif
  store_pair<kStream>(a, b, p);
}

// Stores a, b in pair order when they already hold values of T (round_to<T> results): for bf16
// the low 16 bits are zero, so no rounding is needed.
template <bool kStream = false, class T> HWY_INLINE void store_pair_exact(VF a, VF b, T* p) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16_t>) {
    const DU du;
    const hn::Repartition<uint16_t, DF> d16;
    const VU even = hn::ShiftRight<16>(hn::BitCast(du, b));
    put<kStream>(hn::OddEven(hn::BitCast(d16, a), hn::BitCast(d16, even)), d16, &p->bits);
  } else
#endif
  {
    store_pair<kStream>(a, b, p);
  }
}

// f32 scratch in pair order: a at p, b at p + N.
HWY_INLINE void load_scratch(const float* p, VF& a, VF& b) {
  a = load(p);
  b = load(p + hn::Lanes(DF()));
}
HWY_INLINE void store_scratch(VF a, VF b, float* p) {
  store(a, p);
  store(b, p + hn::Lanes(DF()));
}

// Elements [0, n) of a row: pair(i) for each full pair step i = 0, 2N, ...; then tail(i, count)
// for the rest, one vector (count <= N) at a time.
template <class Pair, class Tail>
HWY_INLINE void for_each_pair(int64_t n, Pair&& pair, Tail&& tail) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) pair(i);
  for (; i < n; i += lanes) tail(i, size_t(std::min(lanes, n - i)));
}

// Note [streaming stores]: a kernel whose rows do not fit the last-level cache may write its
// outputs with non-temporal stores (store_pair<true>): the lines go to memory without being read
// first (no read-for-ownership), which saves a third of a copy's traffic; the harness's copy
// ceiling (memcpy) does the same. The caller guarantees alignment (every pair step of every row
// aligned to its bytes), writes tails with plain stores, and calls hwy::FlushStream() before the
// data is read by another thread.

// Note [row prefetch]: a two-pass row kernel reads memory only in pass 1; pass 2 runs from L1 /
// L2 while the memory bus idles. Pass 2 therefore prefetches the next row, one pair step at a
// time, so pass 1 of that row finds it in cache and the bus stays busy during both passes.
// prefetch_step(p) covers the bytes of one pair step at p (64 bytes or less per line touched;
// a pair step of bf16 is 32-128 bytes, of f32 64-256: one prefetch per cache line it spans).
template <class T> HWY_INLINE void prefetch_step(const T* p) {
  constexpr size_t kLine = 64;
  const size_t bytes = 2 * hn::Lanes(DF()) * sizeof(T);
  for (size_t off = 0; off < bytes; off += kLine)
    hwy::Prefetch(reinterpret_cast<const uint8_t*>(p) + off);
}

// Where the pair steps of a row of n elements end (the tail starts).
HWY_INLINE int64_t pair_end(int64_t n) {
  const int64_t step = 2 * int64_t(hn::Lanes(DF()));
  return n - n % step;
}

HWY_INLINE float sum_lanes(VF v) { return hn::GetLane(hn::SumOfLanes(DF(), v)); }

// True when every element of p[0, n) is finite: v * 0 is 0 for a finite v and NaN for a NaN or
// infinite one; four sums, so the loop is not one latency chain.
HWY_INLINE bool all_finite(const float* p, int64_t n) {
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  VF z0 = hn::Zero(d), z1 = hn::Zero(d), z2 = hn::Zero(d), z3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    z0 = hn::MulAdd(load(p + i), hn::Zero(d), z0);
    z1 = hn::MulAdd(load(p + i + lanes), hn::Zero(d), z1);
    z2 = hn::MulAdd(load(p + i + 2 * lanes), hn::Zero(d), z2);
    z3 = hn::MulAdd(load(p + i + 3 * lanes), hn::Zero(d), z3);
  }
  for (; i < n; i += lanes) z0 = hn::MulAdd(load_n(p + i, size_t(std::min(lanes, n - i))), hn::Zero(d), z0);
  return sum_lanes(hn::Add(hn::Add(z0, z1), hn::Add(z2, z3))) == 0.0f;
}

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
// The row is in Note [pair order] for T.
template <class T> HWY_INLINE void gain_row(const T* w, float offset, float* gain, int64_t n) {
  const VF voff = hn::Set(DF(), offset);
  for_each_pair(
      n,
      [&](int64_t i) {
        VF a, b;
        load_pair(w + i, a, b);
        store_scratch(hn::Add(a, voff), hn::Add(b, voff), gain + i);
      },
      [&](int64_t i, size_t count) { store_n(hn::Add(load_n(w + i, count), voff), gain + i, count); });
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
