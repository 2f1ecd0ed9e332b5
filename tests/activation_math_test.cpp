// The f32 math of the activation cpu kernels (Note [output precision] in
// ops/activation/functors-inl.h) against double: every bf16 and every f16 value in each piece's
// domain plus a dense sweep, on every SIMD target this CPU runs. The bf16 / f16 kernels use a
// reduced exponential and reciprocal; their relative error must stay within the bounds the note
// states (far below half an ulp of the output), and the f32 kernels keep near-f32 accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/convert.h"
#include "opforge/dtype.h"
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

}  // namespace
}  // namespace opforge
