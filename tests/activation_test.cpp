// The activation family beyond silu_and_mul (ops/activation): every op rejects bad arguments
// through the registry with an error naming the argument and leaves its output untouched; the
// reference and cpu kernels give hand-computed values (incl. the clamps of swigluoai_and_mul,
// the threshold of fatrelu_and_mul and both branches of xielu); NaN inputs give NaN outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cpu/convert.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/activation/internal.h"

namespace opforge {
namespace {

const Context kCtx{};

Tensor filled(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i)
    store_from_double(t.data(), dtype, int64_t(i), values[i]);
  return t;
}

double at(const Tensor& t, int64_t i) { return load_as_double(t.data(), t.dtype(), i); }

struct BadCall {
  std::string op;
  std::vector<Value> args;  // the first is the output
  std::string arg;          // the argument the error must name
};

TEST(ActivationFamilyChecks, BadArgumentsNameTheArgumentAndWriteNothing) {
  Registry reg;
  register_activation(reg);
  Tensor x = filled({4, 8}, DType::f32, {}), odd = filled({4, 7}, DType::f32, {});
  Tensor x16 = filled({4, 8}, DType::f16, {});
  Tensor half = filled({4, 4}, DType::f32, {}), full = filled({4, 8}, DType::f32, {});
  Tensor wrong = filled({4, 5}, DType::f32, {});
  const std::string none = "none";
  const std::vector<BadCall> calls = {
      {"mul_and_silu", {half.view(), odd.view()}, "x"},
      {"mul_and_silu", {wrong.view(), x.view()}, "y"},
      {"mul_and_silu_backward", {full.view(), wrong.view(), x.view()}, "dy"},
      {"gelu_and_mul", {half.view(), x.view(), std::string("erf")}, "approximate"},
      {"gelu_and_mul", {half.view(), x16.view(), none}, "y"},
      {"gelu_and_mul_backward", {full.view(), half.view(), x.view(), std::string("")},
       "approximate"},
      {"fatrelu_and_mul", {half.view(), x.view(), double(NAN)}, "threshold"},
      {"fatrelu_and_mul_backward", {wrong.view(), half.view(), x.view(), 0.0}, "dx"},
      {"swigluoai_and_mul", {half.view(), x.view(), 1.702, 0.0}, "limit"},
      {"swigluoai_and_mul", {half.view(), x.view(), double(INFINITY), 7.0}, "alpha"},
      {"swigluoai_and_mul_backward", {x.view(), half.view(), x.view(), 1.702, 7.0}, "dx"},
      {"gelu_new", {wrong.view(), x.view()}, "y"},
      {"gelu_new_backward", {x.view(), full.view(), x.view()}, "dx"},  // dx may be dy, not x
      {"gelu_fast", {x16.view(), x.view()}, "y"},
      {"quick_gelu_backward", {full.view(), wrong.view(), x.view()}, "dy"},
      {"relu2", {half.view(), x.view()}, "y"},
      {"relu2_backward", {x.view(), full.view(), x.view()}, "dx"},
      {"xielu", {full.view(), x.view(), 0.8, 0.8, 0.5, 1e-3}, "eps"},
      {"xielu", {full.view(), x.view(), double(NAN), 0.8, 0.5, -1e-6}, "alpha_p"},
      {"xielu_backward", {full.view(), full.view(), x.view(), 0.8, 0.8, double(INFINITY), -1e-6},
       "beta"},
  };
  for (const BadCall& c : calls) {
    SCOPED_TRACE(c.op + " / " + c.arg);
    const TensorView& out = std::get<TensorView>(c.args[0]);
    std::vector<unsigned char> before(static_cast<unsigned char*>(out.data),
                                      static_cast<unsigned char*>(out.data) + size_t(bytes_of(out)));
    try {
      reg.call(c.op, c.args);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("'" + c.arg + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.op), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(before.data(), out.data, before.size()), 0);
  }
}

// Runs `forward` (a reference or cpu kernel) on x in every kernel dtype and compares with
// `expected` (f32: 1e-6 relative; bf16 / f16: their rounding).
template <class F>
void expect_forward(const char* what, const Shape& x_shape, const Shape& y_shape,
                    const std::vector<double>& x_values, const std::vector<double>& expected,
                    F forward) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(what) + " " + dtype_name(t));
    const double tol = t == DType::f32 ? 1e-6 : t == DType::f16 ? 2e-3 : 1.6e-2;
    Tensor x = filled(x_shape, t, x_values), y = filled(y_shape, t, {});
    forward(y.view(), x.view());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(at(y, int64_t(i)), expected[i], tol * (1 + std::fabs(expected[i])))
          << "element " << i;
  }
}

void gated_hand_examples(bool cpu) {
  {
    // x = [a | b]; mul_and_silu: a * silu(b), a = 2, b = 1.
    expect_forward("mul_and_silu", {1, 2}, {1, 1}, {2, 1}, {1.4621171572600098},
                   [&](const TV& y, const TV& x) {
                     cpu ? mul_and_silu_cpu(kCtx, y, x) : mul_and_silu_reference(kCtx, y, x);
                   });
    for (std::string_view approx : {"none", "tanh"}) {
      const double g1 = approx == "none" ? 0.8413447460685429 : 0.8411919906082768;
      expect_forward("gelu_and_mul", {1, 4}, {1, 2}, {1, 0, 1, 5}, {g1, 0},
                     [&](const TV& y, const TV& x) {
                       cpu ? gelu_and_mul_cpu(kCtx, y, x, approx)
                           : gelu_and_mul_reference(kCtx, y, x, approx);
                     });
    }
    // threshold 0.5: 0.4 is cut, 0.6 passes; b = 2.
    expect_forward("fatrelu_and_mul", {1, 4}, {1, 2}, {0.4, 0.6, 2, 2}, {0, 1.2},
                   [&](const TV& y, const TV& x) {
                     cpu ? fatrelu_and_mul_cpu(kCtx, y, x, 0.5)
                         : fatrelu_and_mul_reference(kCtx, y, x, 0.5);
                   });
    // Interleaved (g, u): (1, 0.5) -> 1.5 * 1 * sigmoid(1.702); (10, -9) clamps to (7, -7):
    // (-7 + 1) * 7 * sigmoid(1.702 * 7).
    expect_forward("swigluoai_and_mul", {1, 4}, {1, 2}, {1, 0.5, 10, -9},
                   {1.268693648899232, -41.99971876981991}, [&](const TV& y, const TV& x) {
                     cpu ? swigluoai_and_mul_cpu(kCtx, y, x, 1.702, 7.0)
                         : swigluoai_and_mul_reference(kCtx, y, x, 1.702, 7.0);
                   });
  }
}

void pointwise_hand_examples(bool cpu) {
  {
    const std::vector<double> x = {1, 0, -2, 3};
    expect_forward("gelu_new", {4}, {4}, x, {0.8411919906082768, 0}, [&](const TV& y, const TV& v) {
      cpu ? gelu_new_cpu(kCtx, y, v) : gelu_new_reference(kCtx, y, v);
    });
    expect_forward("gelu_fast", {4}, {4}, x, {0.8411919906082768, 0}, [&](const TV& y, const TV& v) {
      cpu ? gelu_fast_cpu(kCtx, y, v) : gelu_fast_reference(kCtx, y, v);
    });
    expect_forward("quick_gelu", {4}, {4}, x, {0.8457957659328212, 0},
                   [&](const TV& y, const TV& v) {
                     cpu ? quick_gelu_cpu(kCtx, y, v) : quick_gelu_reference(kCtx, y, v);
                   });
    expect_forward("relu2", {4}, {4}, x, {1, 0, 0, 9}, [&](const TV& y, const TV& v) {
      cpu ? relu2_cpu(kCtx, y, v) : relu2_reference(kCtx, y, v);
    });
    // 1 -> 0.8 + 0.5; -1 -> (expm1(-1) + 1) 0.8 - 0.5.
    expect_forward("xielu", {2}, {2}, {1, -1}, {1.3, -0.20569644706284612},
                   [&](const TV& y, const TV& v) {
                     cpu ? xielu_cpu(kCtx, y, v, 0.8, 0.8, 0.5, -1e-6)
                         : xielu_reference(kCtx, y, v, 0.8, 0.8, 0.5, -1e-6);
                   });
  }
}

TEST(ActivationFamilyValues, ReferenceHandExamples) {
  gated_hand_examples(false);
  pointwise_hand_examples(false);
}

// The cpu kernels on every SIMD target this machine runs (the dispatch is restricted in turn).
TEST(ActivationFamilyValues, CpuHandExamplesOnEveryTarget) {
  for (const cpu::SimdTarget& target : cpu::simd_targets()) {
    SCOPED_TRACE(target.name);
    cpu::restrict_simd_target_for_testing(target.bit);
    gated_hand_examples(true);
    pointwise_hand_examples(true);
  }
  cpu::restrict_simd_target_for_testing(0);
}

// Clamped inputs of swigluoai_and_mul get no gradient (torch.clamp's rule), kernel by kernel.
TEST(ActivationFamilyValues, SwigluoaiClampsStopTheGradient) {
  for (bool cpu : {false, true}) {
    Tensor x = filled({1, 4}, DType::f32, {10, -9, 1, 0.5});
    Tensor dy = filled({1, 2}, DType::f32, {1, 1}), dx = filled({1, 4}, DType::f32, {});
    if (cpu) swigluoai_and_mul_backward_cpu(kCtx, dx.view(), dy.view(), x.view(), 1.702, 7.0);
    else swigluoai_and_mul_backward_reference(kCtx, dx.view(), dy.view(), x.view(), 1.702, 7.0);
    EXPECT_EQ(at(dx, 0), 0.0);
    EXPECT_EQ(at(dx, 1), 0.0);
    const double s = 1 / (1 + std::exp(-1.702));
    EXPECT_NEAR(at(dx, 2), 1.5 * s * (1 + 1.702 * (1 - s)), 1e-6);
    EXPECT_NEAR(at(dx, 3), s, 1e-6);
  }
}

// A NaN input gives a NaN output in every cpu dtype (nothing clamps it away).
TEST(ActivationFamilyCpu, NanPropagates) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = filled({1, 34}, t, std::vector<double>(34, NAN)), y = filled({1, 17}, t, {});
    gelu_and_mul_cpu(kCtx, y.view(), x.view(), "none");
    for (int64_t i = 0; i < 17; ++i) EXPECT_TRUE(std::isnan(at(y, i))) << i;
    Tensor p = filled({1, 17}, t, {});
    gelu_new_cpu(kCtx, p.view(), y.view());
    for (int64_t i = 0; i < 17; ++i) EXPECT_TRUE(std::isnan(at(p, i))) << i;
  }
}

// Infinite and huge inputs: the cpu kernels give what the reference gives (gelu(+inf) = +inf,
// silu(-inf) = -0, a * 0 for a = -inf is NaN in both, ...), in every dtype, on every SIMD target.
TEST(ActivationFamilyCpu, InfinitiesMatchTheReference) {
  const std::vector<double> gates = {INFINITY, -INFINITY, 1e30, -1e30, 20, -20, 0, 1, 9, -9, 14, -14, 3, -3, 0.5, -0.5};
  const int64_t d = int64_t(gates.size());
  std::vector<double> gated_in(gates);
  gated_in.insert(gated_in.end(), gates.size(), 1.0);  // x = [gate | up = 1]
  using Gated = void (*)(const Context&, const TV&, const TV&);
  struct Case {
    const char* name;
    bool gated;
    std::function<void(const TV&, const TV&, bool)> run;
  };
  const std::vector<Case> cases = {
      {"silu_and_mul", true, [](const TV& y, const TV& x, bool c) { (c ? Gated(silu_and_mul_cpu) : Gated(silu_and_mul_reference))(kCtx, y, x); }},
      {"gelu_and_mul none", true, [](const TV& y, const TV& x, bool c) { c ? gelu_and_mul_cpu(kCtx, y, x, "none") : gelu_and_mul_reference(kCtx, y, x, "none"); }},
      {"gelu_and_mul tanh", true, [](const TV& y, const TV& x, bool c) { c ? gelu_and_mul_cpu(kCtx, y, x, "tanh") : gelu_and_mul_reference(kCtx, y, x, "tanh"); }},
      {"gelu_new", false, [](const TV& y, const TV& x, bool c) { (c ? Gated(gelu_new_cpu) : Gated(gelu_new_reference))(kCtx, y, x); }},
      {"gelu_fast", false, [](const TV& y, const TV& x, bool c) { (c ? Gated(gelu_fast_cpu) : Gated(gelu_fast_reference))(kCtx, y, x); }},
      {"quick_gelu", false, [](const TV& y, const TV& x, bool c) { (c ? Gated(quick_gelu_cpu) : Gated(quick_gelu_reference))(kCtx, y, x); }},
  };
  for (const cpu::SimdTarget& target : cpu::simd_targets()) {
    cpu::restrict_simd_target_for_testing(target.bit);
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(target.name) + " " + dtype_name(t) + " " + c.name);
        const std::vector<double>& in = c.gated ? gated_in : gates;
        Tensor x = filled({1, int64_t(in.size())}, t, in);
        Tensor want = filled({1, d}, t, {}), got = filled({1, d}, t, {});
        c.run(want.view(), x.view(), false);
        c.run(got.view(), x.view(), true);
        for (int64_t i = 0; i < d; ++i) {
          const double w = at(want, i), g = at(got, i);
          if (std::isnan(w) || std::isinf(w)) {
            EXPECT_EQ(std::isnan(g), std::isnan(w)) << "input " << gates[size_t(i)] << ": " << g << " vs " << w;
            if (std::isinf(w)) {
              EXPECT_EQ(g, w) << "input " << gates[size_t(i)];
            }
          } else {
            EXPECT_NEAR(g, w, 1e-2 * std::abs(w) + 1e-6) << "input " << gates[size_t(i)];
          }
        }
      }
  }
  cpu::restrict_simd_target_for_testing(0);
}

}  // namespace
}  // namespace opforge
