// The f32 math of the activation cpu kernels (Note [output precision] in
// ops/activation/functors-inl.h) against double: every bf16 and every f16 value in each piece's
// domain plus a dense sweep, on every SIMD target this CPU runs. The bf16 / f16 kernels use a
// reduced exponential and reciprocal; their relative error must stay within the bounds the note
// states (far below half an ulp of the output), and the f32 kernels keep near-f32 accuracy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/convert.h"
#include "opforge/dtype.h"
#include "opforge/tensor.h"
#include "ops/activation/internal.h"

namespace opforge {
namespace {

// Every finite bf16 and f16 value, and 2^20 + 1 evenly spaced values, within [lo, hi].
std::vector<float> inputs(double lo, double hi) {
  std::vector<float> out;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    uint32_t f32_bits = bits << 16;
    float from_bf16;
    std::memcpy(&from_bf16, &f32_bits, sizeof from_bf16);
    f16_t h;
    h.bits = uint16_t(bits);
    for (float v : {from_bf16, float(h)})
      if (std::isfinite(v) && v >= lo && v <= hi) out.push_back(v);
  }
  const int steps = 1 << 20;
  for (int i = 0; i <= steps; ++i) out.push_back(float(lo + (hi - lo) * i / steps));
  return out;
}

struct Piece {
  MathProbe probe;
  const char* name;
  double lo, hi;
  double (*exact)(double);
  double bound_bf16, bound_f16, bound_f32;  // relative error
};

double sigmoid(double z) { return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z)); }

// The bounds of Note [output precision] (bf16, f16), and what the f32 kernels reach. Where the
// argument of the exponential is large (the tails of erfc and gelu), its own f32 rounding
// dominates: e^u moves by |u| 2^-24 relative, whatever the polynomial.
const Piece kPieces[] = {
    {MathProbe::exp, "exp", -86.0, 86.0, [](double x) { return std::exp(x); }, 8.5e-5, 1e-5, 5e-7},
    {MathProbe::expm1, "expm1", -100.0, 0.0, [](double x) { return std::expm1(x); }, 2e-5, 1e-6,
     5e-7},
    {MathProbe::recip, "recip", 1.0, 2.0, [](double x) { return 1 / x; }, 5e-7, 5e-7, 1e-7},
    {MathProbe::erfc, "erfc", 0.0, 9.0, [](double z) { return std::erfc(z); }, 1.2e-4, 2.6e-5,
     1e-5},
    {MathProbe::silu, "silu", -80.0, 1e30, [](double x) { return x * sigmoid(x); }, 8.5e-5, 1e-5,
     5e-7},
    {MathProbe::gelu_tanh, "gelu_tanh", -9.0, 1e4,
     [](double x) { return x * sigmoid(2 * 0.7978845608028654 * (x + 0.044715 * x * x * x)); },
     9e-5, 1.2e-5, 1e-5},
    {MathProbe::gelu_erf, "gelu_erf", -9.0, 1e4,
     [](double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }, 1.2e-4, 2.6e-5, 1e-5},
};

TEST(ActivationMath, RelativeErrorWithinTheStatedBoundsOnEveryTarget) {
  for (const cpu::SimdTarget& target : cpu::simd_targets()) {
    cpu::restrict_simd_target_for_testing(target.bit);
    for (const Piece& piece : kPieces) {
      const std::vector<float> x = inputs(piece.lo, piece.hi);
      std::vector<float> got(x.size());
      for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
        activation_math_probe(piece.probe, dtype, x.data(), got.data(), int64_t(x.size()));
        const double bound = dtype == DType::bf16  ? piece.bound_bf16
                             : dtype == DType::f16 ? piece.bound_f16
                                                   : piece.bound_f32;
        double worst = 0;
        float worst_x = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const double want = piece.exact(double(x[i]));
          if (want == 0) {
            ASSERT_EQ(got[i], 0.0f) << piece.name << " at " << x[i];
            continue;
          }
          const double err = std::fabs(double(got[i]) - want) / std::fabs(want);
          if (!(err <= worst)) {
            worst = err;
            worst_x = x[i];
          }
        }
        EXPECT_LE(worst, bound) << target.name << " " << dtype_name(dtype) << " " << piece.name
                                << ": worst at x = " << worst_x;
        std::printf("%-6s %-5s %-10s max relative error %.3g (bound %.3g)\n", target.name.c_str(),
                    dtype_name(dtype), piece.name, worst, bound);
      }
    }
  }
  cpu::restrict_simd_target_for_testing(0);
}

// ---- the kernels end to end: one rounding away from the exact result ------------------------------
double sig(double z) { return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z)); }

// Distance in ulps between two bf16 / f16 bit patterns of finite values.
int64_t ulps(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t v) { return v & 0x8000 ? -int64_t(v & 0x7fff) : int64_t(v); };
  return std::abs(ordered(a) - ordered(b));
}

struct Kernel {
  const char* name;
  bool gated;
  double lo;                       // smallest gate / input value checked (below, results underflow)
  double (*exact)(double a, double b);
  void (*run)(const TensorView& y, const TensorView& x);
};

const Context kCtx{};
constexpr double kOaiAlpha = 1.702, kOaiLimit = 7.0;
const Kernel kKernels[] = {
    {"silu_and_mul", true, -80, [](double a, double b) { return a * sig(a) * b; },
     [](const TensorView& y, const TensorView& x) { silu_and_mul_cpu(kCtx, y, x); }},
    {"gelu_and_mul tanh", true, -9,
     [](double a, double b) { return a * sig(2 * 0.7978845608028654 * (a + 0.044715 * a * a * a)) * b; },
     [](const TensorView& y, const TensorView& x) { gelu_and_mul_cpu(kCtx, y, x, "tanh"); }},
    {"gelu_and_mul none", true, -9,
     [](double a, double b) { return a * 0.5 * std::erfc(-a / std::sqrt(2.0)) * b; },
     [](const TensorView& y, const TensorView& x) { gelu_and_mul_cpu(kCtx, y, x, "none"); }},
    {"swigluoai_and_mul", true, -40,
     [](double a, double b) {
       const double g = std::min(a, kOaiLimit);
       return g * sig(kOaiAlpha * g) * (std::clamp(b, -kOaiLimit, kOaiLimit) + 1);
     },
     [](const TensorView& y, const TensorView& x) {
       swigluoai_and_mul_cpu(kCtx, y, x, kOaiAlpha, kOaiLimit);
     }},
    {"quick_gelu", false, -45, [](double a, double) { return a * sig(1.702 * a); },
     [](const TensorView& y, const TensorView& x) { quick_gelu_cpu(kCtx, y, x); }},
    {"gelu_new", false, -9,
     [](double a, double) { return a * sig(2 * 0.7978845608028654 * (a + 0.044715 * a * a * a)); },
     [](const TensorView& y, const TensorView& x) { gelu_new_cpu(kCtx, y, x); }},
    {"xielu", false, -1e4,
     [](double a, double) {
       return a > 0 ? 0.8 * a * a + 0.5 * a : (std::expm1(std::min(a, -1e-6)) - a) * 0.8 + 0.5 * a;
     },
     [](const TensorView& y, const TensorView& x) { xielu_cpu(kCtx, y, x, 0.8, 0.8, 0.5, -1e-6); }},
};

// Every finite bf16 (f16) gate value from `lo` up to 1e4, times up values 1 and -2.75 for the gated
// ops: the kernel's bf16 (f16) result is the exact one rounded, or one ulp beside it (Note
// [output precision]), and that hardly more often than with full f32 math.
TEST(ActivationMath, KernelsWithinOneUlpOfTheRoundedExactResult) {
  for (const cpu::SimdTarget& target : cpu::simd_targets()) {
  cpu::restrict_simd_target_for_testing(target.bit);
  SCOPED_TRACE(target.name);
  for (DType dtype : {DType::bf16, DType::f16}) {
    std::vector<double> gates;
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      const uint16_t b16 = uint16_t(bits);
      const double v = load_as_double(&b16, dtype, 0);
      if (std::isfinite(v) && v >= -1e4 && v <= 1e4) gates.push_back(v);
    }
    const int64_t n = int64_t(gates.size());
    for (const Kernel& k : kKernels) {
      for (double up : {1.0, -2.75}) {
        if (!k.gated && up != 1.0) continue;
        Tensor x = Tensor::zeros({1, k.gated ? 2 * n : n}, dtype);
        Tensor y = Tensor::zeros({1, n}, dtype);
        const bool interleaved = std::string(k.name) == "swigluoai_and_mul";
        for (int64_t i = 0; i < n; ++i) {
          store_from_double(x.data(), dtype, interleaved ? 2 * i : i, gates[size_t(i)]);
          if (k.gated) store_from_double(x.data(), dtype, interleaved ? 2 * i + 1 : n + i, up);
        }
        k.run(y.view(), x.view());
        // The f32 kernel on the same values, its results rounded to dtype: what full f32 math
        // gives where the exact result lies within about 2^-24 of a rounding midpoint (e.g.
        // silu(a) ~ a / 2 for tiny a).
        Tensor x32 = Tensor::copy_of(x.view(), x.view().device, DType::f32);
        Tensor y32 = Tensor::zeros({1, n}, DType::f32);
        k.run(y32.view(), x32.view());
        int64_t off_by_one = 0, f32_off = 0, checked = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double a = gates[size_t(i)];
          // Below 2^-20 the exact result lies within 2^-20 of a/2 (times up), which double already
          // rounds to a midpoint: no rounding there says anything about the kernel.
          if (a < k.lo || std::fabs(a) < 0x1p-20) continue;
          uint16_t want, from_f32;
          store_from_double(&want, dtype, 0, k.exact(a, up));
          store_from_double(&from_f32, dtype, 0, double(static_cast<const float*>(y32.data())[i]));
          const uint16_t got = static_cast<const uint16_t*>(y.data())[i];
          const int64_t d = ulps(got, want);
          ASSERT_LE(d, 1) << k.name << " " << dtype_name(dtype) << " at " << a << " x " << up
                          << ": got " << load_as_double(&got, dtype, 0) << ", want "
                          << load_as_double(&want, dtype, 0);
          off_by_one += d;
          f32_off += ulps(from_f32, want);
          ++checked;
        }
        // An error of at most 1/16 (bf16) or 1/9 (f16) of half an ulp moves a result across a
        // rounding midpoint with a probability of about that fraction times the error's average
        // share of the bound: ~1% measured; at most 2.5% more than f32 math.
        EXPECT_LE(double(off_by_one), double(f32_off) + 0.025 * double(checked))
            << k.name << " " << dtype_name(dtype);
        std::printf("%-6s %-18s %-5s up %5.2f: %5lld of %lld results one ulp off (f32: %lld)\n",
                    target.name.c_str(), k.name, dtype_name(dtype), up, (long long)off_by_one,
                    (long long)checked, (long long)f32_off);
      }
    }
  }
  }
  cpu::restrict_simd_target_for_testing(0);
}

}  // namespace
}  // namespace opforge
