// The element math of kl_div, jsd and tvd on CUDA: each op's element loss and its derivative, as
// the kernels of ops/loss/cuda_divergence.cu apply them (math: the ops' docs, ops/loss/loss.h).
// Included by cuda_divergence.cu only.
#pragma once

#include <cmath>
#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge::cuda::loss::pair {

using namespace cuda::rows;  // NOLINT: exp_of, exp2_ftz, log2_ftz, kLog2e, kLn2

enum class Pair { kl, kl_log, jsd, tvd };

// beta_zero / beta_one: jsd's beta is exactly 0 or 1 (decided on the double, as the reference does:
// a beta that only rounds to 0 or 1 in f32 takes the general formula).
struct PairParams {
  float eps, beta;
  bool beta_zero, beta_one;
};

// Note [element log]: log of an element-loss term. The accurate logf (a polynomial of about 15
// instructions) unless kFast: then 16-bit data takes ln 2 * log2_ftz(x) (lg2.approx.ftz on the
// special-function unit, absolute error below 2^-21 on [0.5, 2], a few ulps elsewhere: far under
// the 2^-8 / 2^-11 spacing of bf16 / f16 data, as Note [element exp]) for normal arguments, where
// .ftz changes nothing and saves the range test and rescale of __logf; zero, subnormal, negative
// and NaN arguments keep logf, so edge values (log 0 = -inf) are the reference's. jsd's backward
// takes it always (its log m; H200 bf16 1,024 x 32,000: 71.9 -> 62.8 us, 65% -> 75% of copy,
// docs/perf/gpu-h200-2026-11-30-round28.md): log m enters as a - log m, where an absolute error
// of 2^-21 in log m is what logf's own rounding of |log m| up to 16 gives.
template <class T, bool kFast> __device__ __forceinline__ float log_of(float x) {
  if constexpr (kFast && !std::is_same_v<T, float>) {
    if (x >= 1.17549435e-38f) return log2_ftz(x) * kLn2;  // FLT_MIN; false for NaN
  }
  return logf(x);
}

// jsd's beta as a kernel knows it: read from PairParams per element (any), or fixed at compile
// time (Note [jsd beta at compile time]).
enum class Beta { any, zero, one, mixed };
template <Beta kB> __device__ __forceinline__ bool beta_zero(const PairParams& o) {
  return kB == Beta::any ? o.beta_zero : kB == Beta::zero;
}
template <Beta kB> __device__ __forceinline__ bool beta_one(const PairParams& o) {
  return kB == Beta::any ? o.beta_one : kB == Beta::one;
}

// Element loss of (a, b): kl (y_pred, y_true), jsd (input = log Q, target = log P), tvd (p, q).
// jsd with m = 0 (both exps underflow f32): m log m is 0, its limit (the reference's f64 exps do
// not underflow there), not 0 * -inf.
template <class T, Pair K, bool kFastLog = false, Beta kB = Beta::any>
__device__ __forceinline__ float element_loss(float a, float b, const PairParams& o) {
  if constexpr (K == Pair::kl) {
    return b * (log_of<T, kFastLog>(fmaxf(b, o.eps)) - a);
  } else if constexpr (K == Pair::kl_log) {
    return exp_of<T>(b) * (b - a);
  } else if constexpr (K == Pair::jsd) {
    if (beta_zero<kB>(o)) return exp_of<T>(b) * (b - a);
    if (beta_one<kB>(o)) return exp_of<T>(a) * (a - b);
    const float q = exp_of<T>(a), p = exp_of<T>(b);
    const float m = o.beta * p + (1.0f - o.beta) * q;
    const float m_log_m = m == 0.0f ? 0.0f : m * log_of<T, kFastLog>(m);
    return o.beta * p * b + (1.0f - o.beta) * q * a - m_log_m;
  } else {
    return 0.5f * fabsf(a - b);
  }
}

// Note [jsd in log2 units]: jsd's element loss of 16-bit data, added to `s` in units of ln 2
// (the caller multiplies its sum by ln 2 once). With a2 = a log2(e), b2 = b log2(e), p = 2^b2,
// q = 2^a2 (the exps' own arguments, ex2.approx.ftz), the loss is ln 2 (beta p b2 + (1 - beta) q
// a2 - m log2 m): three FFMAs into s and no conversion of each log back to base e. log2 m on the
// special-function unit (lg2.approx.ftz) of max(m, FLT_MIN): m = 0 adds 0, a subnormal m at most
// 126 m (below 2^-119), where the accurate log's m log m is as small. H200 (bf16 1,024 x 32,000):
// docs/perf/gpu-h200-2026-11-30-round33.md.
template <Beta kB> __device__ __forceinline__ void jsd_add_log2(float a, float b, const PairParams& o, float& s) {
  static_assert(kB != Beta::any, "the beta case is fixed at compile time here");
  const float a2 = a * kLog2e, b2 = b * kLog2e;
  if constexpr (kB == Beta::zero) {
    s = fmaf(exp2_ftz(b2), b2 - a2, s);
  } else if constexpr (kB == Beta::one) {
    s = fmaf(exp2_ftz(a2), a2 - b2, s);
  } else {
    const float pb = o.beta * exp2_ftz(b2), qb = (1.0f - o.beta) * exp2_ftz(a2), m = pb + qb;
    s = fmaf(pb, b2, s);
    s = fmaf(qb, a2, s);
    s = fmaf(-m, log2_ftz(fmaxf(m, 1.17549435e-38f)), s);
  }
}

// Note [jsd backward in log2 units]: jsd's d loss / da of 16-bit data for beta in (0, 1),
// (1 - beta) q (a - ln m) = ln 2 (1 - beta) q (a2 - log2 m), a2 = a log2(e), with q = 2^a2 and
// p = 2^(b log2 e) on ex2.approx.ftz and log2 m on lg2.approx.ftz of max(m, FLT_MIN): no test of
// m against FLT_MIN with the accurate logf behind it and no select for m = 0 (then (1 - beta) q
// is 0 and so is the product; a subnormal m moves the result by at most 23 m, below 3e-37), as
// Note [jsd in log2 units] does for the forward. a = -inf gives NaN, as the reference's formula.
// The bf16 kernel of 4 packs a thread: 2,072 -> 992 SASS instructions. H200, us, before -> after
// (docs/perf/gpu-h200-2026-12-03-round41.md): f16 1,024 x 32,000 74.6 -> 51.3 (63% -> 92% of
// copy), bf16 59.4 -> 58.1 (80% -> 81.7%), bf16 16 x 128,256 4.57 -> 3.85, 16 x 32,000 2.40 -> 2.11.
// d(element loss)/da. kl reads only b (y_true).
template <class T, Pair K, Beta kB = Beta::any>
__device__ __forceinline__ float element_grad(float a, float b, const PairParams& o) {
  if constexpr (K == Pair::kl) {
    return -b;
  } else if constexpr (K == Pair::kl_log) {
    return -exp_of<T>(b);
  } else if constexpr (K == Pair::jsd) {
    if (beta_zero<kB>(o)) return -exp_of<T>(b);
    if (beta_one<kB>(o)) {
      const float q = exp_of<T>(a);
      return q * (a - b) + q;
    }
    if constexpr (!std::is_same_v<T, float>) {  // Note [jsd backward in log2 units]
      const float a2 = a * kLog2e, qb = (1.0f - o.beta) * exp2_ftz(a2);
      const float m = fmaf(o.beta, exp2_ftz(b * kLog2e), qb);
      return (kLn2 * qb) * (a2 - log2_ftz(fmaxf(m, 1.17549435e-38f)));
    }
    const float q = exp_of<T>(a);
    const float m = o.beta * exp_of<T>(b) + (1.0f - o.beta) * q;
    return m == 0.0f ? 0.0f : (1.0f - o.beta) * q * (a - log_of<T, true>(m));  // m = 0: q = 0
  } else {
    return a > b ? 0.5f : -0.5f;
  }
}

template <Pair K> constexpr bool reads_a_in_backward = !(K == Pair::kl || K == Pair::kl_log);

}  // namespace opforge::cuda::loss::pair
