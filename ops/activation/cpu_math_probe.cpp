// activation_math_probe (internal.h): the f32 math of the activation cpu kernels, one piece at a
// time, for tests/activation_math_test.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/cpu_math_probe.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/activation/functors-inl.h"
#include "ops/activation/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::activation_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// tests/activation_math_test.cpp: one piece of the math of T's kernels on x[0, n).
template <class T> void math_probe_of(MathProbe what, const float* x, float* out, int64_t n) {
  using M = MathFor<T>;
  for_each_vector(n, [&](int64_t i, size_t count) {
    const VF v = load_n(x + i, count);
    VF r = v;
    switch (what) {
      case MathProbe::exp: r = M::exp(v); break;
      case MathProbe::expm1: r = M::expm1(v); break;
      case MathProbe::recip: r = M::recip(v); break;
      case MathProbe::erfc: {
        const VF t = GeluErf<M>::t_of(v);
        r = hn::Mul(t, M::exp(hn::NegMulAdd(v, v, M::erfc_poly(t))));
        break;
      }
      case MathProbe::silu: r = ScaledSilu<M>{{}, 1.0f}.value(v); break;
      case MathProbe::gelu_tanh: r = GeluTanh<M>{{}, 0.7978845608028654f}.value(v); break;
      case MathProbe::gelu_erf: r = GeluErf<M>{}.value(v); break;
    }
    store_n(r, out + i, count);
  });
}

void math_probe(MathProbe what, DType dtype, const float* x, float* out, int64_t n) {
  switch (dtype) {
    case DType::bf16: return math_probe_of<bf16_t>(what, x, out, n);
    case DType::f16: return math_probe_of<f16_t>(what, x, out, n);
    default: return math_probe_of<float>(what, x, out, n);
  }
}

}  // namespace opforge::activation_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge {
namespace activation_cpu {
HWY_EXPORT(math_probe);
}  // namespace activation_cpu

void activation_math_probe(MathProbe what, DType dtype, const float* x, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(activation_cpu::math_probe)(what, dtype, x, out, n);
}

}  // namespace opforge
#endif  // HWY_ONCE
