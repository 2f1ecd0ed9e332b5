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
// non-positive argument (exp_f32 below) and one reciprocal. tanh(u) is never evaluated:
// 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu_tanh(x) = x sigmoid(2u). The exponential is a degree-6
// polynomial on [-ln2/2, ln2/2] after a Cody-Waite reduction (relative error ~2e-7, far inside
// the f32 tolerance); sigmoid's reciprocal is one divide (the divider runs beside the FMA units,
// and its exact rounding makes silu(a) of a large a exactly a).
// Both are a handful of fused multiply-adds, so a bf16 kernel stays memory-bound on AVX2.

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
// accuracy (FullMath: exp_f32, an exactly rounded divide, Highway's Expm1, the 9-term erfc).
// The reduced math works in base 2: x log2(e) = n + g with n an integer and |g| <= 1/2 (the
// product kept exact inside one FMA), 2^g by a minimax polynomial, 1 / d by the hardware estimate
// and one Newton step (12 -> 23 bits on AVX2, no divide: the divider of a small core is slow and
// not pipelined). Relative error bounds (derived from the fits, checked against double over every
// bf16 / f16 input and a dense f32 sweep by tests/activation_math_test.cpp):
//                        bf16 (degree)       f16 (degree)
//   exp(x), x <= 88      8e-5  (3)           4e-6  (4)       [+ |x| 2e-8 from log2(e) in f32]
//   expm1(x), x <= 0     2e-5  (3)           1e-6  (4)
//   erfc (Phi)           1e-4  (P: 5)        1.5e-5 (P: 5)
//   1 / d, d in [1, 2]   2^-22               2^-22
// Every bound is at most 1/16 of the output's half ulp, so a result rounds to the same bf16 / f16
// value as the exact one except within that margin of a rounding midpoint.
template <int kExpDegree> struct ReducedMath {
  static_assert(kExpDegree == 3 || kExpDegree == 4, "fitted degrees: 3 (bf16), 4 (f16)");
  // Minimax fits of 2^g and (2^g - 1) / g on [-1/2, 1/2] (relative error), highest power first.
  static constexpr float kExp3[] = {0.0551716685f, 0.242611125f, 0.693260968f, 0.999928057f};
  static constexpr float kExp4[] = {0.00957010221f, 0.0559178591f, 0.240247443f, 0.693121791f,
                                    0.999999285f};
  static constexpr float kExpm13[] = {0.00961811095f, 0.0558372885f, 0.240232527f, 0.693136871f};
  static constexpr float kExpm14[] = {0.00133335392f, 0.00966624543f, 0.0555050038f,
                                      0.240223512f, 0.693147123f};

  // n + g = x log2(e) (n integral, |g| <= 1/2) and the f32 2^n, for -126 <= n <= 127.
  HWY_INLINE static void split(VF x, VF& g, VF& two_n) {
    const VF log2e = splat(1.44269504088896341f);
    const VF shifter = splat(12582912.0f + 127.0f);  // Note [activation math]: exp_f32
    const VF t = hn::MulAdd(x, log2e, shifter);
    g = hn::MulSub(x, log2e, hn::Sub(t, shifter));
    two_n = hn::BitCast(DF(), hn::ShiftLeft<23>(hn::BitCast(DU(), t)));
  }

  // e^x for x <= 88; 0 below -87 and NaN stays NaN, as exp_f32.
  HWY_INLINE static VF exp(VF x) {
    const auto underflow = hn::Lt(x, splat(-87.0f));
    VF g, two_n;
    split(hn::Max(splat(-87.0f), x), g, two_n);
    const VF p = kExpDegree == 3 ? horner(g, kExp3) : horner(g, kExp4);
    return hn::IfThenZeroElse(underflow, hn::Mul(p, two_n));
  }

  // e^x - 1 for x <= 0 with relative accuracy near 0: 2^n (2^g - 1) + (2^n - 1), where 2^g - 1
  // = g q(g) and 2^n - 1 is exact; below -20 the f32 result is -1 (x is clamped there).
  HWY_INLINE static VF expm1(VF x) {
    VF g, two_n;
    split(hn::Max(splat(-20.0f), x), g, two_n);
    const VF q = kExpDegree == 3 ? horner(g, kExpm13) : horner(g, kExpm14);
    return hn::MulAdd(two_n, hn::Mul(g, q), hn::Sub(two_n, splat(1.0f)));
  }

  // 1 / d for d in [1, 2]: the estimate and one Newton step.
  HWY_INLINE static VF recip(VF d) { return reciprocal1(d); }

  // P(t) of erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2): a degree-5 fit on z in [0, 9.6]
  // (t >= 0.17; beyond, erfc(z) < 1e-40 and the exponential underflows to 0), absolute error
  // below 8e-6 (so the relative error of erfc).
  HWY_INLINE static VF erfc_poly(VF t) {
    static constexpr float kP[] = {0.228783444f, -0.709170461f, 0.474469960f,
                                   0.254455805f, 1.01801026f, -1.26654148f};
    return horner(t, kP);
  }
};

// The full f32 accuracy (Note [activation math]).
struct FullMath {
  HWY_INLINE static VF exp(VF x) { return exp_f32(x); }
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

// a sigmoid(alpha a): silu (alpha 1), quick_gelu (alpha 1.702).
template <class M> struct ScaledSilu : IdentityUp {
  float alpha = 1.0f;
  HWY_INLINE VF value(VF a) const { return hn::Mul(a, sigmoid<M>(hn::Mul(splat(alpha), a))); }
  // d/da = s + alpha a s (1 - s) = s (1 + alpha a (1 - s))
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    VF s, sc;
    sigmoid_both<M>(hn::Mul(splat(alpha), a), s, sc);
    v = hn::Mul(a, s);
    slope = hn::Mul(s, hn::MulAdd(hn::Mul(splat(alpha), a), sc, splat(1.0f)));
  }
};

// x sigmoid(2u), u = c (x + 0.044715 x^3): gelu_new (c = sqrt(2/pi)), gelu_fast (c = 0.7978845608)
// and gelu_and_mul's "tanh".
template <class M> struct GeluTanh : IdentityUp {
  float c = 0.7978845608028654f;
  HWY_INLINE VF two_u(VF a) const {
    const VF a2 = hn::Mul(a, a);
    return hn::Mul(hn::Mul(splat(2.0f * c), a), hn::MulAdd(splat(0.044715f), a2, splat(1.0f)));
  }
  HWY_INLINE VF value(VF a) const { return hn::Mul(a, sigmoid<M>(two_u(a))); }
  // d/da = s + a s (1 - s) 2c (1 + 3 * 0.044715 a^2)
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    VF s, sc;
    sigmoid_both<M>(two_u(a), s, sc);
    v = hn::Mul(a, s);
    const VF du = hn::Mul(splat(2.0f * c), hn::MulAdd(splat(3 * 0.044715f), hn::Mul(a, a), splat(1.0f)));
    slope = hn::MulAdd(hn::Mul(v, sc), du, s);
  }
};

// x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2, from erfc(z), z = |x| / sqrt 2, by the
// Chebyshev fit of Press et al. (Numerical Recipes, 6.2: fractional error below 1.2e-7 for every
// z >= 0): erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2). Phi = 1 - erfc / 2 for x >= 0 and
// erfc / 2 below, so the left tail keeps its relative accuracy.
template <class M> struct GeluErf : IdentityUp {
  HWY_INLINE static VF phi_cdf(VF a) {
    const VF z = hn::Mul(hn::Abs(a), splat(0.70710678118654752f));
    const VF t = reciprocal1(hn::MulAdd(splat(0.5f), z, splat(1.0f)));
    const VF p = M::erfc_poly(t);
    const VF half_erfc = hn::Mul(hn::Mul(splat(0.5f), t), M::exp(hn::NegMulAdd(z, z, p)));
    return if_negative(a, half_erfc, hn::Sub(splat(1.0f), half_erfc));
  }
  HWY_INLINE VF value(VF a) const { return hn::Mul(a, phi_cdf(a)); }
  // d/da = Phi(a) + a phi(a), phi(a) = e^(-a^2 / 2) / sqrt(2 pi)
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    const VF cdf = phi_cdf(a);
    v = hn::Mul(a, cdf);
    const VF pdf = hn::Mul(splat(0.39894228040143268f), M::exp(hn::Mul(splat(-0.5f), hn::Mul(a, a))));
    slope = hn::MulAdd(a, pdf, cdf);
  }
};

// a if a > threshold else 0 (fatrelu_and_mul).
struct FatRelu : IdentityUp {
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
  float alpha = 1.702f, limit = 7.0f;
  HWY_INLINE VF value(VF a) const {
    return ScaledSilu<M>{{}, alpha}.value(hn::Min(a, splat(limit)));
  }
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    ScaledSilu<M>{{}, alpha}.value_slope(hn::Min(a, splat(limit)), v, slope);
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
  float alpha_p = 0.8f, alpha_n = 0.8f, beta = 0.5f, eps = -1e-6f;
  HWY_INLINE VF expm1_part(VF a) const { return M::expm1(hn::Min(a, splat(eps))); }
  HWY_INLINE VF value(VF a) const {
    const VF bx = hn::Mul(splat(beta), a);
    const VF pos = hn::MulAdd(hn::Mul(splat(alpha_p), a), a, bx);
    const VF neg = hn::MulAdd(hn::Sub(expm1_part(a), a), splat(alpha_n), bx);
    return hn::IfThenElse(hn::Gt(a, hn::Zero(DF())), pos, neg);
  }
  // d/dx: 2 alpha_p x + beta for x > 0; alpha_n (e^x [x < eps] - 1) + beta otherwise, and
  // e^x - 1 = expm1(min(x, eps)) where x < eps.
  HWY_INLINE void value_slope(VF a, VF& v, VF& slope) const {
    const VF m = expm1_part(a);
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
