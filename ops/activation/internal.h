// Activation family internals shared by activation.cpp, cpu.cpp and cases.cpp (not public).
#pragma once

#include <string_view>
#include <vector>

#include "ops/activation/activation.h"

namespace opforge {

// ---- cpu.cpp: Highway + OpenMP kernels, <op>_cpu and <op>_backward_cpu -------------------------
using TV = TensorView;
void silu_and_mul_cpu(const Context&, const TV& y, const TV& x);
void silu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void mul_and_silu_cpu(const Context&, const TV& y, const TV& x);
void mul_and_silu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void gelu_and_mul_cpu(const Context&, const TV& y, const TV& x, std::string_view approximate);
void gelu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                               std::string_view approximate);
void fatrelu_and_mul_cpu(const Context&, const TV& y, const TV& x, double threshold);
void fatrelu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                                  double threshold);
void swigluoai_and_mul_cpu(const Context&, const TV& y, const TV& x, double alpha, double limit);
void swigluoai_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                                    double alpha, double limit);
void gelu_new_cpu(const Context&, const TV& y, const TV& x);
void gelu_new_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void gelu_fast_cpu(const Context&, const TV& y, const TV& x);
void gelu_fast_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void quick_gelu_cpu(const Context&, const TV& y, const TV& x);
void quick_gelu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void relu2_cpu(const Context&, const TV& y, const TV& x);
void relu2_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x);
void xielu_cpu(const Context&, const TV& y, const TV& x, double alpha_p, double alpha_n,
               double beta, double eps);
void xielu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x, double alpha_p,
                        double alpha_n, double beta, double eps);

// Why the cpu kernels cannot run (device, dtype), or nullptr: the predicate of every op's cpu
// kernel looks at x alone (the op's check made the other tensors match it).
const char* activation_cpu_reason(const TensorView& x);
// Silences the other parameters of a predicate: applicable<Sig>(..., x, ...) -> reason(x).
template <class... Rest>
const char* cpu_applicable_forward(const TV&, const TV& x, Rest...) {
  return activation_cpu_reason(x);
}
template <class... Rest>
const char* cpu_applicable_backward(const TV&, const TV&, const TV& x, Rest...) {
  return activation_cpu_reason(x);
}
// The existing names of silu_and_mul's predicates (tests call them).
inline const char* silu_and_mul_cpu_applicable(const TV& y, const TV& x) {
  return cpu_applicable_forward(y, x);
}
inline const char* silu_and_mul_backward_cpu_applicable(const TV& dx, const TV& dy, const TV& x) {
  return cpu_applicable_backward(dx, dy, x);
}

// Evaluates one piece of the f32 math the cpu kernels of `dtype` use (Note [output precision] in
// functors-inl.h) on x[0, n) with the dispatched SIMD target: e^x, e^x - 1, 1 / x, erfc(x) for
// x >= 0, and the activations silu, gelu (tanh form) and gelu (erf form). For tests.
enum class MathProbe : uint8_t { exp, expm1, recip, erfc, silu, gelu_tanh, gelu_erf };
void activation_math_probe(MathProbe what, DType dtype, const float* x, float* out, int64_t n);

// ---- cases.cpp ----------------------------------------------------------------------------------
// `backward`: the cases of the backward op (dy as an input, dx as the output).
std::vector<Case> gated_cases(bool backward, const std::vector<CaseArg>& scalars);
std::vector<Case> pointwise_cases(bool backward, const std::vector<CaseArg>& scalars);

// ---- what cpu.cpp's per-target code receives (plain data; strides in elements) ----------------
enum class ActKind : uint8_t { scaled_silu, gelu_tanh, gelu_erf, fatrelu, swiglu_oai, relu2, xielu };

// The scalars of every functor (Note [activation math] in functors-inl.h); each uses its own.
struct ActParams {
  float alpha = 1.0f;      // scaled_silu, swiglu_oai
  float limit = 0.0f;      // swiglu_oai
  float c = 0.0f;          // gelu_tanh
  float threshold = 0.0f;  // fatrelu
  float alpha_p = 0.0f, alpha_n = 0.0f, beta = 0.0f, eps = 0.0f;  // xielu
};

// Rows of an activation call. Gated ops: the outputs are the n = d gated columns, the gate of
// column i sits at x[gate_offset + i] and the up value at x[up_offset + i], or, interleaved, at
// x[2i] and x[2i + 1]. Pointwise ops: n columns, x[i] -> y[i].
struct ActRows {
  DType dtype = DType::f32;
  ActKind act = ActKind::scaled_silu;
  ActParams params;
  int64_t n = 0;
  bool interleaved = false;
  int64_t gate_offset = 0, up_offset = 0;
  bool stream = false;  // Note [streaming stores] in cpu.cpp
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* dy = nullptr;  // backward only
  int64_t dy_stride = 0;
  void* out = nullptr;  // y (forward) or dx (backward)
  int64_t out_stride = 0;
};

}  // namespace opforge
