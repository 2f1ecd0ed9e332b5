// The activation functions of the CUDA kernels (cuda_pointwise.cu), as device functors on f32: the
// same math as the cpu kernels' functors (functors-inl.h, Highway vectors) and the reference
// (reference.cpp, double), written for one lane. functors-inl.h is compiled per Highway target
// and cannot run on the device, so these sit next to it with the same names and formulas.
//
// Every pointwise functor has
//   float value(float a)                          the activation
//   void value_slope(float a, float& v, float& s) the activation and its derivative d value / d a
//
// Note [activation math, cuda]: as on the cpu (Note [activation math] in functors-inl.h),
// tanh-GELU is x sigmoid(2u) (0.5 (1 + tanh(u)) = sigmoid(2u)), and every sigmoid comes from
// e = expf(-|z|) in (0, 1]: s = 1 / (1 + e) for z >= 0, e / (1 + e) otherwise, with 1 - s taken
// from the same e (never 1 - s as a difference, which loses its relative accuracy where s is near
// 1 and derivatives multiply it by terms that grow with a). expf, expm1f: accurate CUDA math (no
// fast-math intrinsics), except where a functor's `fast` is set: the pointwise kernels
// (cuda_pointwise.cu) and the gated ones (cuda.cu, cuda_gated.cu) set it for f16 / bf16 data, and
// the sigmoid then takes exp2_ftz and rcp_ftz (ex2.approx.ftz, rcp.approx.ftz: relative errors
// near 2^-22 and 2^-23, far under the 2^-11 / 2^-8 spacing of the result's dtype; Note [element
// exp] in backends/cuda/cuda_launch.cuh), and a forward its one-sided form (Note [forward
// sigmoid]), which keeps gelu_new / gelu_fast / quick_gelu, silu_and_mul, mul_and_silu,
// gelu_and_mul and swigluoai_and_mul from being bound by the arithmetic instead of memory (xielu:
// Note [xielu fast]). What .ftz changes: an exp below 2^-126 is 0, so s or 1 - s is 0 where the
// reference has a value below 1.2e-38. __expf (no .ftz) costs a range test and two multiplies
// more an exp; with that and the one-sided forward, H200, bf16, 1,024 / 16,384 x 14,336, us, before
// -> after
// (docs/perf/gpu-h200-2026-12-03-round41.md): gelu_new 15.99 -> 15.06 / 236.6 -> 221.9 (87.5% ->
// 92.8% / 94.6% -> 100.8% of copy), gelu_new_backward 22.56 -> 21.67 / 347.2 -> 328.9,
// swigluoai_and_mul 22.44 -> 21.67 / 338.0 -> 320.6, its backward 38.87 -> 38.61 / 588.3 -> 575.8,
// gelu_and_mul (erf) 23.19 -> 21.48 / 349.2 -> 319.1. Comparisons are written so that NaN
// propagates as in the reference (std::max(a, 0) and std::min(a, eps) return a NaN a).
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/cuda_launch.cuh"

namespace opforge::cuda::act {

// s = sigmoid(z) and sc = 1 - s = sigmoid(-z). fast: the intrinsics (16-bit data only).
__device__ __forceinline__ void sigmoid_both(float z, float& s, float& sc, bool fast = false) {
  const float e = fast ? exp2_ftz(-fabsf(z) * kLog2e) : expf(-fabsf(z));
  const float r = fast ? rcp_ftz(1.0f + e) : 1.0f / (1.0f + e);
  const float er = e * r;
  const bool negative = z < 0.0f;
  s = negative ? er : r;
  sc = negative ? r : er;
}

// Note [forward sigmoid]: a forward needs s = sigmoid(z) alone, never 1 - s, so with `fast` it
// takes s = 1 / (1 + 2^w), w = -z log2(e), with no |z| and no select: 2^w overflows to +inf for z
// below -88.7 and the reciprocal is then 0, the limit; 2^w below 2^-126 is 0 and s is 1. The
// scale log2(e) is folded into the functor's own constants (w is a z already scaled), so s costs
// one MUFU.EX2, an add and one MUFU.RCP (exp2_ftz, rcp_ftz: Note [element exp]); the both-sided
// form above spends a multiply, a compare and a select more, and __expf without .ftz a range test
// and two multiplies (bf16 gelu_new: 200 -> 144 SASS instructions for a pack of 8). Relative
// error near 2^-21, far under the 2^-11 / 2^-8 spacing of 16-bit results.
__device__ __forceinline__ float sigmoid_of_log2(float w) { return rcp_ftz(1.0f + exp2_ftz(w)); }

// a sigmoid(alpha a): quick_gelu (alpha 1.702), swigluoai_and_mul's gate.
struct ScaledSilu {
  float alpha = 1.0f;
  bool fast = false;
  __device__ __forceinline__ float value(float a) const {
    if (fast) return a * sigmoid_of_log2(a * (-kLog2e * alpha));  // Note [forward sigmoid]
    float s, sc;
    sigmoid_both(alpha * a, s, sc, fast);
    return a * s;
  }
  // d/da = s + alpha a s (1 - s) = s (1 + alpha a (1 - s))
  __device__ __forceinline__ void value_slope(float a, float& v, float& slope) const {
    float s, sc;
    sigmoid_both(alpha * a, s, sc, fast);
    v = a * s;
    slope = s * (1.0f + alpha * a * sc);
  }
};

// 0.5 a (1 + tanh(u)) = a sigmoid(2u), u = c (a + 0.044715 a^3): gelu_new (c = sqrt(2/pi)),
// gelu_fast (c = 0.7978845608).
struct GeluTanh {
  float c = 0.7978845608028654f;
  bool fast = false;
  __device__ __forceinline__ float two_u(float a) const {
    return 2.0f * c * a * (1.0f + 0.044715f * a * a);
  }
  __device__ __forceinline__ float value(float a) const {
    if (fast) {  // Note [forward sigmoid]: w = -2u log2(e) = a (k0 + k1 a^2)
      const float k0 = -2.0f * kLog2e * c, k1 = k0 * 0.044715f;
      return a * sigmoid_of_log2(a * (k0 + k1 * (a * a)));
    }
    float s, sc;
    sigmoid_both(two_u(a), s, sc, fast);
    return a * s;
  }
  // d/da = s + a s (1 - s) 2c (1 + 3 * 0.044715 a^2), the reference's
  // 0.5 (1 + t) + 0.5 a (1 - t^2) c (1 + 3 * 0.044715 a^2) with 1 - t^2 = 4 s (1 - s).
  __device__ __forceinline__ void value_slope(float a, float& v, float& slope) const {
    float s, sc;
    sigmoid_both(two_u(a), s, sc, fast);
    v = a * s;
    const float du = 2.0f * c * (1.0f + 3.0f * 0.044715f * a * a);
    slope = s + v * sc * du;
  }
};

// max(a, 0)^2; a NaN a stays NaN (std::max(a, 0) returns a).
struct Relu2 {
  static constexpr bool kTwoRows = true;  // the pointwise kernel's Note [two rows a thread]
  __device__ __forceinline__ static float relu(float a) { return a < 0.0f ? 0.0f : a; }
  __device__ __forceinline__ float value(float a) const {
    const float r = relu(a);
    return r * r;
  }
  __device__ __forceinline__ void value_slope(float a, float& v, float& slope) const {
    const float r = relu(a);
    v = r * r;
    slope = 2.0f * r;
  }
};

// xielu: alpha_p a^2 + beta a for a > 0, (expm1(min(a, eps)) - a) alpha_n + beta a otherwise.
// d/da: 2 alpha_p a + beta for a > 0; alpha_n ((a < eps ? e^a : 0) - 1) + beta otherwise.
// Note [xielu fast]: with `fast` (16-bit data) the forward's expm1(m) - a, m = min(a, eps), is
// taken as (expm1(m) - m) + (m - a) with the polynomial m^2 (1/2 + m/6 + m^2/24) for the first
// term where |m| < 1/8 (truncation below 3.3e-5 relative: it never subtracts two near values, so
// it keeps its relative accuracy where expm1(m) - m is tiny, unlike expm1f(m) - m), and as
// 2^(m log2 e) - (1 + a) elsewhere, the exp one ex2.approx.ftz (absolute error near 2^-22 against
// a value of at least 0.0075: below 4e-5 relative). Both forms and both signs of a are computed and
// selected, with no branch: with random signs a warp ran every path of the branching form one
// after another. The accurate expm1f (range reduction and a polynomial, about 30 instructions)
// with those branches made the bf16 forward bound by the arithmetic. H200, bf16, 16,384 / 1,024 x
// 14,336: 411.7 / 27.8 us (54% / 50% of the copy bandwidth) -> 264.3 / 18.2 (85% / 77%), 255 / 17.8
// with two rows a thread (docs/perf/gpu-h200-2026-11-30-round28.md); then with the degree-6
// polynomial to 1/2 and expm1 - m formed apart from m - a (448 SASS instructions for two rows of a
// pack) 258.4 / 17.8, with this form 384 instructions and 247.4 / 16.86 (87.0% -> 90.3% / 79% ->
// 82.7% of copy; docs/perf/gpu-h200-2026-12-03-round41.md). The slope keeps expf.
struct Xielu {
  static constexpr bool kTwoRows = true;  // the pointwise kernel's Note [two rows a thread]
  float alpha_p = 0.8f, alpha_n = 0.8f, beta = 0.5f, eps = -1e-6f;
  bool fast = false;
  // The value for a <= 0: (expm1(m) - a) alpha_n + beta a, m = min(a, eps).
  __device__ __forceinline__ float negative_part(float a) const {
    if (fast) {  // Note [xielu fast]
      const float m = fminf(a, eps);  // a NaN a: m = eps, and m - a below makes the result NaN
      const float near_zero = (m * m) * (0.5f + m * (1.0f / 6 + m * (1.0f / 24))) + (m - a);
      const float far = exp2_ftz(m * kLog2e) - (1.0f + a);
      return (fabsf(m) < 0.125f ? near_zero : far) * alpha_n + beta * a;
    }
    const float m = eps < a ? eps : a;  // std::min(a, eps): a NaN a stays NaN
    return (expm1f(m) - a) * alpha_n + beta * a;
  }
  __device__ __forceinline__ float value(float a) const {
    if (fast) {  // both sides, then a select (Note [xielu fast])
      const float positive = alpha_p * a * a + beta * a, negative = negative_part(a);
      return a > 0.0f ? positive : negative;
    }
    return a > 0.0f ? alpha_p * a * a + beta * a : negative_part(a);
  }
  __device__ __forceinline__ void value_slope(float a, float& v, float& slope) const {
    if (a > 0.0f) {
      v = alpha_p * a * a + beta * a;
      slope = 2.0f * alpha_p * a + beta;
    } else {
      v = negative_part(a);
      slope = alpha_n * ((a < eps ? expf(a) : 0.0f) - 1.0f) + beta;
    }
  }
};

// swigluoai_and_mul on one (gate a, up b) pair: g = min(a, limit), y = g sigmoid(alpha g) *
// (clamp(b, -limit, limit) + 1). The derivatives pass where the clamps pass their input
// (a <= limit; -limit <= b <= limit), as torch.clamp's gradient and the reference do; NaN
// propagates as std::min / std::clamp do (a NaN input is returned).
struct SwigluOai {
  float alpha = 1.702f, limit = 7.0f;
  bool fast = false;  // the sigmoid's intrinsics (ScaledSilu), for 16-bit data
  __device__ __forceinline__ float gate_in(float a) const { return limit < a ? limit : a; }
  __device__ __forceinline__ float up(float b) const {
    return (b < -limit ? -limit : limit < b ? limit : b) + 1.0f;
  }
  __device__ __forceinline__ float value(float a, float b) const {
    return ScaledSilu{alpha, fast}.value(gate_in(a)) * up(b);
  }
  // (d y / d a, d y / d b) times g.
  __device__ __forceinline__ float2 grad(float a, float b, float g) const {
    float v, slope;
    ScaledSilu{alpha, fast}.value_slope(gate_in(a), v, slope);
    const float gate_slope = a <= limit ? slope : 0.0f;
    const float up_slope = (b >= -limit && b <= limit) ? 1.0f : 0.0f;
    return make_float2(g * up(b) * gate_slope, g * v * up_slope);
  }
};

}  // namespace opforge::cuda::act
