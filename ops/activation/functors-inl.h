// The activation functions of the cpu kernels, as small functors on f32 vectors, compiled once
// per Highway target (include after "hwy/foreach_target.h", like backends/cpu/simd-inl.h).
//
// Every functor has
//   VF value(VF a)                          the activation
//   void value_slope(VF a, VF& v, VF& s)    the activation and its derivative d value / d a
// and the gated ones also
//   VF up(VF b), VF up_slope(VF b)          what multiplies the activation (b itself except for
//                                           swigluoai_and_mul's clamp(b) + 1) and its derivative
// The kernels of cpu.cpp are templates over these; the math of each op is written once here.
//
// Note [activation math]: sigmoid, tanh-GELU and erf-GELU all come down to one exponential of a
// non-positive argument and one reciprocal. tanh(u) is never evaluated: 0.5 (1 + tanh(u)) =
// sigmoid(2u), so gelu_tanh(x) = x sigmoid(2u). Every functor takes its math from a policy M:
// FullMath for f32 outputs (exp_f32 below: a degree-6 polynomial on [-ln2/2, ln2/2] after a
// Cody-Waite reduction, relative error ~2e-7; sigmoid's reciprocal one divide, whose exact
// rounding makes silu(a) of a large a exactly a), ReducedMath for bf16 / f16 outputs (Note
// [output precision]: lower-degree base-2 polynomials and no divide, accurate far below half an
// ulp of the output). The functors also expose their math in steps for Note [staged evaluation].

#if defined(OPFORGE_OPS_ACTIVATION_FUNCTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_ACTIVATION_FUNCTORS_INL_H_
#undef OPFORGE_OPS_ACTIVATION_FUNCTORS_INL_H_
#else
#define OPFORGE_OPS_ACTIVATION_FUNCTORS_INL_H_
#endif

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::activation_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

HWY_INLINE VF splat(float v) { return hn::Set(DF(), v); }

// e^x for x <= 88 (Note [activation math]); 0 below -87 (where e^x < 2^-125: the callers
// multiply it into results far below any tolerance), NaN stays NaN. 2^n is built without a
// float -> int conversion: adding 1.5 * 2^23 + 127 to x log2(e) leaves n + 127 in the low
// mantissa bits, which a shift moves into the exponent field.
HWY_INLINE VF exp_f32(VF x) {
  const DF d;
  const auto underflow = hn::Lt(x, splat(-87.0f));
  x = hn::Max(splat(-87.0f), x);  // keeps NaN (the second operand wins on x86)
  const VF shifter = splat(12582912.0f + 127.0f);
  const VF t = hn::MulAdd(x, splat(1.44269504088896341f), shifter);
  const VF n = hn::Sub(t, shifter);
  // f = x - n ln2 with ln2 = 0.693359375 - 2.12194440e-4 (the first part exact in 9 bits).
  VF f = hn::MulAdd(n, splat(-0.693359375f), x);
  f = hn::MulAdd(n, splat(2.12194440e-4f), f);
  // Taylor polynomial of degree 6 by Estrin's scheme (depth 4 instead of 6 dependent FMAs):
  // (1 + f) + f^2 (1/2 + f/6) + f^4 ((1/24 + f/120) + f^2/720)
  const VF f2 = hn::Mul(f, f);
  const VF f4 = hn::Mul(f2, f2);
  const VF low = hn::MulAdd(f2, hn::MulAdd(f, splat(1.0f / 6), splat(0.5f)), hn::Add(f, splat(1.0f)));
  const VF high = hn::MulAdd(f2, splat(1.0f / 720), hn::MulAdd(f, splat(1.0f / 120), splat(1.0f / 24)));
  const VF p = hn::MulAdd(f4, high, low);
  const VF scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(DU(), t)));
  return hn::IfThenZeroElse(underflow, hn::Mul(p, scale));
}

// 1 / v for v in [1, 2^64]: hardware estimate and one Newton step (~23 bits; erfc's t).
HWY_INLINE VF reciprocal1(VF v) {
  const VF r = hn::ApproximateReciprocal(v);
  return hn::MulAdd(r, hn::NegMulAdd(v, r, splat(1.0f)), r);
}

// p(g) = c[0] + c[1] g + ... by Horner's scheme (the coefficients highest first).
template <size_t N> HWY_INLINE VF horner(VF g, const float (&c)[N]) {
  VF p = splat(c[0]);
  for (size_t i = 1; i < N; ++i) p = hn::MulAdd(p, g, splat(c[i]));
  return p;
}

// Note [output precision]: a bf16 output keeps 8 significant bits and an f16 output 11, so the
// rounding of the store alone moves a result by up to 2^-9 (bf16) or 2^-12 (f16) of itself. The
// f32 math of those kernels only has to stay far below that; the f32 kernels keep the full
// accuracy (FullMath: exp_f32, an exactly rounded divide, Highway's Expm1, the 10-term erfc fit).
// The reduced math works in base 2: u = x log2(e) = n + g with n = round(u) and |g| <= 1/2
// (exact), 2^g by a minimax polynomial in Estrin's form (short dependency chains, Note [staged
// evaluation] in cpu.cpp), 1 / d by the hardware estimate and one Newton step (12 -> 23 bits on
// AVX2, 14 -> 28 on AVX-512, 8 -> 16 on NEON: still 1/16 of f16's half ulp; no divide, which a
// small core does slowly and unpipelined). Relative error bounds: the
// fits' (below) plus the f32 rounding of the exponential's argument (|u| 2^-24 relative, which
// dominates in the tails of erfc and gelu and is the same for the f32 kernels); checked against
// double over every bf16 and f16 input and a dense sweep, on every target, by
// tests/activation_math_test.cpp (measured maxima on AVX2 in brackets):
//                                 bf16 kernels             f16 kernels
//   e^x, |x| <= 86                8.5e-5 (7.9e-5)          1e-5   (6.4e-6)
//   e^x - 1, x <= 0               2e-5   (1.5e-5)          1e-6   (5.9e-7)
//   erfc(z), 0 <= z <= 9          1.2e-4 (9.0e-5)          2.6e-5 (1.8e-5)
//   1 / d, d in [1, 2]            5e-7   (1.5e-7)          5e-7   (1.5e-7)
//   silu, gelu (tanh form)        9e-5   (8.3e-5)          1.2e-5 (1.1e-5)
//   gelu (erf form)               1.2e-4 (8.4e-5)          2.6e-5 (1.3e-5)
// bf16's half ulp is at least 2^-9 = 1.95e-3 of a value and f16's 2^-12 = 2.44e-4, so each bound
// is at most 1/16 (bf16) or 1/9 (f16) of it: a result rounds to the value the exact one rounds to
// except within that margin of a rounding midpoint, where it may land one ulp off (the harness's
// bf16 / f16 tolerances allow two).
template <int kDegree> struct ReducedMath {
  static_assert(kDegree == 3 || kDegree == 4, "fitted degrees: 3 (bf16), 4 (f16)");
  static constexpr bool kReduced = true;
  static constexpr float kLog2e = 1.44269504088896341f;
  // The staged sigmoid (functors below) takes its argument times kExpScale to exp_scaled.
  static constexpr float kExpScale = kLog2e;

  // c0 + c1 g + ... + c4 g^4 (c4 = 0 for degree 3) in Estrin's form: depth 3 instead of 4.
  HWY_INLINE static VF estrin(VF g, float c0, float c1, float c2, float c3, float c4) {
    const VF g2 = hn::Mul(g, g);
    const VF low = hn::MulAdd(splat(c1), g, splat(c0));
    VF high = hn::MulAdd(splat(c3), g, splat(c2));
    if constexpr (kDegree == 4) high = hn::MulAdd(splat(c4), g2, high);
    return hn::MulAdd(g2, high, low);
  }

  // 2^n for integral n in [-126, 127], and +0 for n = -127: n + 127 moved into the exponent field
  // (exp_f32's trick).
  HWY_INLINE static VF pow2i(VF n) {
    const VF shifted = hn::Add(n, splat(12582912.0f + 127.0f));
    return hn::BitCast(DF(), hn::ShiftLeft<23>(hn::BitCast(DU(), shifted)));
  }

  // 2^u for u <= 127; 0 below -126.5 (u is clamped to -127, whose 2^n is +0: no compare), NaN
  // stays NaN (its 2^n is +0 too, and NaN * 0 is NaN). Minimax fits of 2^g on [-1/2, 1/2]
  // (relative error 7.5e-5 for degree 3, 2.6e-6 for degree 4).
  HWY_INLINE static VF exp2(VF u) {
    u = hn::Max(splat(-127.0f), u);  // keeps NaN (the second operand wins on x86)
    const VF n = hn::Round(u);
    const VF g = hn::Sub(u, n);
    const VF p = kDegree == 3
                     ? estrin(g, 0.999928057f, 0.693260968f, 0.242611125f, 0.0551716685f, 0.0f)
                     : estrin(g, 0.999999285f, 0.693121791f, 0.240247443f, 0.0559178591f,
                              0.00957010221f);
    return hn::Mul(p, pow2i(n));
  }

  HWY_INLINE static VF exp(VF x) { return exp2(hn::Mul(x, splat(kLog2e))); }
  HWY_INLINE static VF exp_scaled(VF u) { return exp2(u); }

  // e^x - 1 from u = x log2(e) <= 0, with relative accuracy near 0: 2^n (2^g - 1) + (2^n - 1)
  // where 2^g - 1 = g q(g) (minimax fits of q on [-1/2, 1/2]: relative error 1.5e-5 for degree 3,
  // 4.3e-7 for degree 4) and 2^n - 1 is exact. Below u = -29 the f32 result is -1.
  HWY_INLINE static VF expm1_from_log2(VF u) {
    u = hn::Max(splat(-29.0f), u);
    const VF n = hn::Round(u);
    const VF g = hn::Sub(u, n);
    const VF q = kDegree == 3
                     ? estrin(g, 0.693136871f, 0.240232527f, 0.0558372885f, 0.00961811095f, 0.0f)
                     : estrin(g, 0.693147123f, 0.240223512f, 0.0555050038f, 0.00966624543f,
                              0.00133335392f);
    const VF two_n = pow2i(n);
    return hn::MulAdd(two_n, hn::Mul(g, q), hn::Sub(two_n, splat(1.0f)));
  }
  HWY_INLINE static VF expm1(VF x) { return expm1_from_log2(hn::Mul(x, splat(kLog2e))); }

  // 1 / d for d in [1, 2]: the estimate and one Newton step.
  HWY_INLINE static VF recip(VF d) { return reciprocal1(d); }

  // P(t) of erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2): a degree-5 fit on z in [0, 9.6]
  // (t >= 0.17; beyond, erfc(z) < 1e-40 and the exponential underflows to 0), absolute error
  // below 8e-6 (so the relative error of erfc).
  // Estrin's form: (c0 + c1 t) + t^2 (c2 + c3 t) + t^4 (c4 + c5 t).
  HWY_INLINE static VF erfc_poly(VF t) {
    const VF t2 = hn::Mul(t, t);
    const VF p01 = hn::MulAdd(splat(1.01801026f), t, splat(-1.26654148f));
    const VF p23 = hn::MulAdd(splat(0.474469960f), t, splat(0.254455805f));
    const VF p45 = hn::MulAdd(splat(0.228783444f), t, splat(-0.709170461f));
    return hn::MulAdd(t2, hn::MulAdd(t2, p45, p23), p01);
  }
};

// The full f32 accuracy (Note [activation math]).
struct FullMath {
  static constexpr bool kReduced = false;
  static constexpr float kExpScale = 1.0f;
  HWY_INLINE static VF exp(VF x) { return exp_f32(x); }
  HWY_INLINE static VF exp_scaled(VF x) { return exp_f32(x); }
  HWY_INLINE static VF expm1(VF x) { return hn::Expm1(DF(), x); }
  HWY_INLINE static VF recip(VF d) { return hn::Div(splat(1.0f), d); }
  // Press et al. (Numerical Recipes, 6.2): fractional error below 1.2e-7 for every z >= 0.
  HWY_INLINE static VF erfc_poly(VF t) {
    static constexpr float kP[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f,
                                   0.27886807f,  -0.18628806f, 0.09678418f, 0.37409196f,
                                   1.00002368f, -1.26551223f};
    return horner(t, kP);
  }
};

// The math of a kernel whose outputs are T (Note [output precision]).
template <class T> struct MathOf { using type = FullMath; };
template <> struct MathOf<bf16_t> { using type = ReducedMath<3>; };
template <> struct MathOf<f16_t> { using type = ReducedMath<4>; };
template <class T> using MathFor = typename MathOf<T>::type;

// sigmoid(a) from e = exp(-|a|) in [0, 1]: 1 / (1 + e) for a >= 0, e / (1 + e) otherwise, so the
// exponential never overflows and 1 + e stays in [1, 2].
// yes where a's sign bit is set, else no. Highway 1.0's IfNegativeThenElse relies on a blend that
// reads only the sign bit, which SSSE3 and older lack (their select needs a full-lane mask).
HWY_INLINE VF if_negative(VF a, VF yes, VF no) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  return hn::IfNegativeThenElse(a, yes, no);
#else
  const DF d;
  const DI di;
  return hn::IfThenElse(hn::MaskFromVec(hn::BitCast(d, hn::BroadcastSignBit(hn::BitCast(di, a)))),
                        yes, no);
#endif
}

HWY_INLINE VF neg_abs(VF a) { return hn::Or(a, splat(-0.0f)); }  // -|a|: set the sign bit

template <class M> HWY_INLINE VF sigmoid(VF a) {
  const VF e = M::exp(neg_abs(a));
  const VF r = M::recip(hn::Add(splat(1.0f), e));
  return if_negative(a, hn::Mul(e, r), r);  // blends on the sign bit, no compare
}

// s = sigmoid(a) and sc = 1 - s = sigmoid(-a), each from e and r as above: 1 - s computed as a
// difference would lose its relative accuracy where s is near 1, and derivatives multiply it by
// terms that grow with a (a^3 in gelu_tanh).
template <class M> HWY_INLINE void sigmoid_both(VF a, VF& s, VF& sc) {
  const VF e = M::exp(neg_abs(a));
  const VF r = M::recip(hn::Add(splat(1.0f), e));
  const VF er = hn::Mul(e, r);
  s = if_negative(a, er, r);
  sc = if_negative(a, r, er);
}

// Gated functors multiply the activation of the gate by the up value itself.
struct IdentityUp {
  static constexpr bool kIdentityUp = true;
  HWY_INLINE VF up(VF b) const { return b; }
  HWY_INLINE VF up_slope(VF) const { return splat(1.0f); }
};

// Note [staged evaluation] (cpu.cpp): a functor with kStaged splits its math into up to three
// steps that the kernels run as separate passes over a short chunk (with FullMath the steps are
// exactly the f32 operations of value / value_slope, so the results are the same bits):
//   VF stage1(VF a)                 the exponential (or 1 / (1 + z / 2) for erf)
//   VF stage2(VF a, VF s1)          only if kThreeStages: e.g. 1 / (1 + e)
//   VF value3(VF a, VF s1, VF s2)   and value_slope3(a, s1, s2, v, slope): the rest
// (s2 is s1 when kThreeStages is false). value / value_slope then run the steps back to back.
template <class Fn> HWY_INLINE VF staged_value(const Fn& fn, VF a) {
  const VF s1 = fn.stage1(a);
  if constexpr (Fn::kThreeStages) return fn.value3(a, s1, fn.stage2(a, s1));
  else return fn.value3(a, s1, s1);
}
template <class Fn> HWY_INLINE void staged_value_slope(const Fn& fn, VF a, VF& v, VF& slope) {
  const VF s1 = fn.stage1(a);
  if constexpr (Fn::kThreeStages) fn.value_slope3(a, s1, fn.stage2(a, s1), v, slope);
  else fn.value_slope3(a, s1, s1, v, slope);
}

// Staged sigmoid(z): e = exp(-|z|), r = 1 / (1 + e), then sigmoid(z) = r for z >= 0 and e r below;
// 1 - sigmoid(z) the other way round. `z_scaled` is z M::kExpScale (log2(e) for ReducedMath's
// base-2 exponential, 1 for FullMath).
template <class M> HWY_INLINE VF sigmoid_stage1(VF z_scaled) {
  return M::exp_scaled(neg_abs(z_scaled));
}
template <class M> HWY_INLINE VF sigmoid_stage2(VF e) { return M::recip(hn::Add(splat(1.0f), e)); }

// a sigmoid(alpha a): silu (alpha 1), quick_gelu (alpha 1.702).
template <class M> struct ScaledSilu : IdentityUp {
  static constexpr bool kStaged = M::kReduced, kThreeStages = true;
  float alpha = 1.0f;
  HWY_INLINE VF value(VF a) const {
    if constexpr (M::kReduced) return staged_value(*this, a);
    else return hn::Mul(a, sigmoid<M>(hn::Mul(splat(alpha), a)));
  }
  // d/da = s + alpha a s (1 - s) = s (1 + alpha a (1 - s))
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    if constexpr (M::kReduced) return staged_value_slope(*this, a, v, slope);
    VF s, sc;
    sigmoid_both<M>(hn::Mul(splat(alpha), a), s, sc);
    v = hn::Mul(a, s);
    slope = hn::Mul(s, hn::MulAdd(hn::Mul(splat(alpha), a), sc, splat(1.0f)));
  }
  HWY_INLINE VF stage1(VF a) const {
    return sigmoid_stage1<M>(hn::Mul(splat(alpha * M::kExpScale), a));
  }
  HWY_INLINE VF stage2(VF, VF e) const { return sigmoid_stage2<M>(e); }
  // The sign of z = alpha a: a's, flipped for a negative alpha.
  HWY_INLINE VF z_sign(VF a) const { return hn::Xor(a, hn::And(splat(alpha), splat(-0.0f))); }
  HWY_INLINE VF value3(VF a, VF e, VF r) const {
    return hn::Mul(a, if_negative(z_sign(a), hn::Mul(e, r), r));
  }
  HWY_INLINE void value_slope3(VF a, VF e, VF r, VF& v, VF& slope) const {
    const VF er = hn::Mul(e, r), zs = z_sign(a);
    const VF s = if_negative(zs, er, r), sc = if_negative(zs, r, er);
    v = hn::Mul(a, s);
    slope = hn::Mul(s, hn::MulAdd(hn::Mul(splat(alpha), a), sc, splat(1.0f)));
  }
};

// x sigmoid(2u), u = c (x + 0.044715 x^3): gelu_new (c = sqrt(2/pi)), gelu_fast (c = 0.7978845608)
// and gelu_and_mul's "tanh". c > 0, so 2u has the sign of x.
template <class M> struct GeluTanh : IdentityUp {
  static constexpr bool kStaged = M::kReduced, kThreeStages = true;
  float c = 0.7978845608028654f;
  HWY_INLINE VF two_u(VF a, float scale = 1.0f) const {
    const VF a2 = hn::Mul(a, a);
    return hn::Mul(hn::Mul(splat(2.0f * c * scale), a), hn::MulAdd(splat(0.044715f), a2, splat(1.0f)));
  }
  HWY_INLINE VF value(VF a) const {
    if constexpr (M::kReduced) return staged_value(*this, a);
    else return hn::Mul(a, sigmoid<M>(two_u(a)));
  }
  HWY_INLINE VF slope_of(VF a, VF s, VF sc, VF v) const {
    // d/da = s + a s (1 - s) 2c (1 + 3 * 0.044715 a^2)
    const VF du = hn::Mul(splat(2.0f * c), hn::MulAdd(splat(3 * 0.044715f), hn::Mul(a, a), splat(1.0f)));
    return hn::MulAdd(hn::Mul(v, sc), du, s);
  }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    if constexpr (M::kReduced) return staged_value_slope(*this, a, v, slope);
    VF s, sc;
    sigmoid_both<M>(two_u(a), s, sc);
    v = hn::Mul(a, s);
    slope = slope_of(a, s, sc, v);
  }
  HWY_INLINE VF stage1(VF a) const { return sigmoid_stage1<M>(two_u(a, M::kExpScale)); }
  HWY_INLINE VF stage2(VF, VF e) const { return sigmoid_stage2<M>(e); }
  HWY_INLINE VF value3(VF a, VF e, VF r) const {
    return hn::Mul(a, if_negative(a, hn::Mul(e, r), r));
  }
  HWY_INLINE void value_slope3(VF a, VF e, VF r, VF& v, VF& slope) const {
    const VF er = hn::Mul(e, r);
    const VF s = if_negative(a, er, r), sc = if_negative(a, r, er);
    v = hn::Mul(a, s);
    slope = slope_of(a, s, sc, v);
  }
};

// x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2, from erfc(z), z = |x| / sqrt 2, in the form of
// Press et al. (Numerical Recipes, 6.2): erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), with
// M's P (FullMath: their fit, fractional error below 1.2e-7 for every z >= 0). Phi = 1 - erfc / 2
// for x >= 0 and erfc / 2 below, so the left tail keeps its relative accuracy.
template <class M> struct GeluErf : IdentityUp {
  static constexpr bool kStaged = true, kThreeStages = true;  // f32 too: Note [staged evaluation]
  HWY_INLINE static VF z_of(VF a) { return hn::Mul(hn::Abs(a), splat(0.70710678118654752f)); }
  // z is capped at 9.6 (the fits' range) for t only: past it exp(-z^2 + P(t)) underflows to 0
  // anyway, and z = inf would make reciprocal1's Newton step inf * 0 = NaN (gelu(+inf) = +inf).
  HWY_INLINE static VF t_of(VF z) {
    return reciprocal1(hn::MulAdd(splat(0.5f), hn::Min(z, splat(9.6f)), splat(1.0f)));
  }
  HWY_INLINE static VF cdf_of(VF a, VF t, VF e) {
    const VF half_erfc = hn::Mul(hn::Mul(splat(0.5f), t), e);
    return if_negative(a, half_erfc, hn::Sub(splat(1.0f), half_erfc));
  }
  HWY_INLINE static VF phi_cdf(VF a) {
    const VF z = z_of(a);
    const VF t = t_of(z);
    return cdf_of(a, t, M::exp(hn::NegMulAdd(z, z, M::erfc_poly(t))));
  }
  // phi(a) = e^(-a^2 / 2) / sqrt(2 pi)
  HWY_INLINE static VF pdf(VF a) {
    return hn::Mul(splat(0.39894228040143268f), M::exp(hn::Mul(splat(-0.5f), hn::Mul(a, a))));
  }
  HWY_INLINE VF value(VF a) const {
    if constexpr (M::kReduced) return staged_value(*this, a);
    else return hn::Mul(a, phi_cdf(a));
  }
  // d/da = Phi(a) + a phi(a)
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    if constexpr (M::kReduced) return staged_value_slope(*this, a, v, slope);
    const VF cdf = phi_cdf(a);
    v = hn::Mul(a, cdf);
    slope = hn::MulAdd(a, pdf(a), cdf);
  }
  HWY_INLINE VF stage1(VF a) const { return t_of(z_of(a)); }
  HWY_INLINE VF stage2(VF a, VF t) const {
    const VF z = z_of(a);
    return M::exp(hn::NegMulAdd(z, z, M::erfc_poly(t)));
  }
  HWY_INLINE VF value3(VF a, VF t, VF e) const { return hn::Mul(a, cdf_of(a, t, e)); }
  HWY_INLINE void value_slope3(VF a, VF t, VF e, VF& v, VF& slope) const {
    const VF cdf = cdf_of(a, t, e);
    v = hn::Mul(a, cdf);
    slope = hn::MulAdd(a, pdf(a), cdf);
  }
};

// a if a > threshold else 0 (fatrelu_and_mul).
struct FatRelu : IdentityUp {
  static constexpr bool kStaged = false;
  float threshold = 0.0f;
  HWY_INLINE VF value(VF a) const {
    return hn::IfThenElseZero(hn::Gt(a, splat(threshold)), a);
  }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    const auto on = hn::Gt(a, splat(threshold));
    v = hn::IfThenElseZero(on, a);
    slope = hn::IfThenElseZero(on, splat(1.0f));
  }
};

// swigluoai_and_mul: g = min(a, limit), y = g sigmoid(alpha g) (clamp(b, -limit, limit) + 1).
// Derivatives pass where the clamps pass their input (a <= limit; -limit <= b <= limit), as
// torch.clamp's gradient does.
template <class M> struct SwigluOai {
  static constexpr bool kIdentityUp = false;
  static constexpr bool kStaged = M::kReduced, kThreeStages = true;
  float alpha = 1.702f, limit = 7.0f;
  HWY_INLINE ScaledSilu<M> silu() const { return ScaledSilu<M>{{}, alpha}; }
  HWY_INLINE VF gate(VF a) const { return hn::Min(a, splat(limit)); }
  HWY_INLINE VF value(VF a) const { return silu().value(gate(a)); }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    silu().value_slope(gate(a), v, slope);
    slope = hn::IfThenElseZero(hn::Le(a, splat(limit)), slope);
  }
  HWY_INLINE VF stage1(VF a) const { return silu().stage1(gate(a)); }
  HWY_INLINE VF stage2(VF a, VF e) const { return silu().stage2(gate(a), e); }
  HWY_INLINE VF value3(VF a, VF e, VF r) const { return silu().value3(gate(a), e, r); }
  HWY_INLINE void value_slope3(VF a, VF e, VF r, VF& v, VF& slope) const {
    silu().value_slope3(gate(a), e, r, v, slope);
    slope = hn::IfThenElseZero(hn::Le(a, splat(limit)), slope);
  }
  HWY_INLINE VF up(VF b) const {
    return hn::Add(hn::Min(hn::Max(b, splat(-limit)), splat(limit)), splat(1.0f));
  }
  HWY_INLINE VF up_slope(VF b) const {
    const auto inside = hn::And(hn::Ge(b, splat(-limit)), hn::Le(b, splat(limit)));
    return hn::IfThenElseZero(inside, splat(1.0f));
  }
};

// relu(x)^2
struct Relu2 : IdentityUp {
  static constexpr bool kStaged = false;
  HWY_INLINE VF value(VF a) const {
    const VF r = hn::Max(a, hn::Zero(DF()));
    return hn::Mul(r, r);
  }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    const VF r = hn::Max(a, hn::Zero(DF()));
    v = hn::Mul(r, r);
    slope = hn::Add(r, r);
  }
};

// xielu: alpha_p x^2 + beta x for x > 0, (expm1(min(x, eps)) - x) alpha_n + beta x otherwise.
template <class M> struct Xielu : IdentityUp {
  static constexpr bool kStaged = M::kReduced, kThreeStages = false;
  float alpha_p = 0.8f, alpha_n = 0.8f, beta = 0.5f, eps = -1e-6f;
  HWY_INLINE VF expm1_part(VF a) const { return M::expm1(hn::Min(a, splat(eps))); }
  HWY_INLINE VF value(VF a) const {
    if constexpr (M::kReduced) return staged_value(*this, a);
    else return value3(a, expm1_part(a), hn::Zero(DF()));
  }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    if constexpr (M::kReduced) return staged_value_slope(*this, a, v, slope);
    else value_slope3(a, expm1_part(a), hn::Zero(DF()), v, slope);
  }
  HWY_INLINE VF stage1(VF a) const { return expm1_part(a); }
  HWY_INLINE VF value3(VF a, VF m, VF) const {
    const VF bx = hn::Mul(splat(beta), a);
    const VF pos = hn::MulAdd(hn::Mul(splat(alpha_p), a), a, bx);
    const VF neg = hn::MulAdd(hn::Sub(m, a), splat(alpha_n), bx);
    return hn::IfThenElse(hn::Gt(a, hn::Zero(DF())), pos, neg);
  }
  // d/dx: 2 alpha_p x + beta for x > 0; alpha_n (e^x [x < eps] - 1) + beta otherwise, and
  // e^x - 1 = expm1(min(x, eps)) = m where x < eps.
  HWY_INLINE void value_slope3(VF a, VF m, VF, VF& v, VF& slope) const {
    const VF bx = hn::Mul(splat(beta), a);
    const auto positive = hn::Gt(a, hn::Zero(DF()));
    v = hn::IfThenElse(positive, hn::MulAdd(hn::Mul(splat(alpha_p), a), a, bx),
                       hn::MulAdd(hn::Sub(m, a), splat(alpha_n), bx));
    const VF below_eps = hn::IfThenElse(hn::Lt(a, splat(eps)), m, splat(-1.0f));
    slope = hn::IfThenElse(positive, hn::MulAdd(splat(2.0f * alpha_p), a, splat(beta)),
                           hn::MulAdd(below_eps, splat(alpha_n), splat(beta)));
  }
};

}  // namespace opforge::activation_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
