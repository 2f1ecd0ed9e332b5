// Activation family: gated activations (x [..., 2d] -> y [..., d]) and pointwise activations
// (y = f(x), same shape), each with its backward op (Note [gradient naming]).
//
// Every kernel computes in f32 (reference: f64) and rounds once per output. Rows follow
// Note [row layout] (ops/norm/norm.h).
#pragma once

#include <string_view>

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

using TV = TensorView;

// ---- gated: y = act(gate) * up --------------------------------------------------------------

struct SiluAndMul {
  static constexpr const char* name = "silu_and_mul";
  static constexpr const char* backward = "silu_and_mul_backward";
  using Signature = void(const TV& y, const TV& x);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "x: [..., 2d], y: [..., d]; y = silu(x[..., :d]) * x[..., d:] with silu(a) = a / (1 + e^-a), "
      "computed in f32 and rounded once (vLLM's silu_and_mul; Liger rounds silu(a) to the dtype "
      "before the multiply).";
  static void check(const TV& y, const TV& x);
};

struct SiluAndMulBackward {
  static constexpr const char* name = "silu_and_mul_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "Backward of silu_and_mul. With a = x[..., :d], b = x[..., d:], s = sigmoid(a): "
      "dx[..., :d] = dy * b * s * (1 + a * (1 - s)), dx[..., d:] = dy * a * s.";
  static void check(const TV& dx, const TV& dy, const TV& x);
};

struct MulAndSilu {
  static constexpr const char* name = "mul_and_silu";
  static constexpr const char* backward = "mul_and_silu_backward";
  using Signature = void(const TV& y, const TV& x);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "x: [..., 2d], y: [..., d]; y = x[..., :d] * silu(x[..., d:]): silu on the second half "
      "(vLLM's mul_and_silu), f32 math, one rounding.";
  static void check(const TV& y, const TV& x);
};

struct MulAndSiluBackward {
  static constexpr const char* name = "mul_and_silu_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "Backward of mul_and_silu. With a = x[..., :d], b = x[..., d:], s = sigmoid(b): "
      "dx[..., :d] = dy * b * s, dx[..., d:] = dy * a * s * (1 + b * (1 - s)).";
  static void check(const TV& dx, const TV& dy, const TV& x);
};

struct GeluAndMul {
  static constexpr const char* name = "gelu_and_mul";
  static constexpr const char* backward = "gelu_and_mul_backward";
  using Signature = void(const TV& y, const TV& x, std::string_view approximate);
  static constexpr ArgSpec args[] = {
      {"y", ArgRole::out}, {"x", ArgRole::in}, {"approximate", ArgRole::scalar, "none"}};
  static constexpr const char* doc =
      "x: [..., 2d], y: [..., d]; y = gelu(x[..., :d]) * x[..., d:]. approximate \"none\": "
      "gelu(a) = a * (1 + erf(a / sqrt 2)) / 2; \"tanh\": a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 "
      "a^3))) / 2 (vLLM's gelu_and_mul / gelu_tanh_and_mul; Liger's geglu is \"tanh\" only and "
      "rounds gelu(a) before the multiply). f32 math, one rounding.";
  static void check(const TV& y, const TV& x, std::string_view approximate);
};

struct GeluAndMulBackward {
  static constexpr const char* name = "gelu_and_mul_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x, std::string_view approximate);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in},
                                     {"approximate", ArgRole::scalar, "none"}};
  static constexpr const char* doc =
      "Backward of gelu_and_mul: dx[..., :d] = dy * b * gelu'(a), dx[..., d:] = dy * gelu(a); "
      "gelu'(a) = Phi(a) + a phi(a) (\"none\") or the derivative of the tanh form (\"tanh\").";
  static void check(const TV& dx, const TV& dy, const TV& x, std::string_view approximate);
};

struct FatreluAndMul {
  static constexpr const char* name = "fatrelu_and_mul";
  static constexpr const char* backward = "fatrelu_and_mul_backward";
  using Signature = void(const TV& y, const TV& x, double threshold);
  static constexpr ArgSpec args[] = {
      {"y", ArgRole::out}, {"x", ArgRole::in}, {"threshold", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "x: [..., 2d], y: [..., d]; y = (a if a > threshold else 0) * b with a = x[..., :d], "
      "b = x[..., d:] (vLLM's fatrelu_and_mul, MiniCPM-S). threshold is any finite value.";
  static void check(const TV& y, const TV& x, double threshold);
};

struct FatreluAndMulBackward {
  static constexpr const char* name = "fatrelu_and_mul_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x, double threshold);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in},
                                     {"threshold", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "Backward of fatrelu_and_mul: dx[..., :d] = dy * b * [a > threshold], "
      "dx[..., d:] = dy * (a if a > threshold else 0).";
  static void check(const TV& dx, const TV& dy, const TV& x, double threshold);
};

struct SwigluoaiAndMul {
  static constexpr const char* name = "swigluoai_and_mul";
  static constexpr const char* backward = "swigluoai_and_mul_backward";
  using Signature = void(const TV& y, const TV& x, double alpha, double limit);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"alpha", ArgRole::scalar, "1.702"},
                                     {"limit", ArgRole::scalar, "7.0"}};
  static constexpr const char* doc =
      "x: [..., 2d] of interleaved (gate, up) pairs, y: [..., d] (GPT-OSS, vLLM's "
      "swigluoai_and_mul): g = min(x[..., 0::2], limit), u = clamp(x[..., 1::2], -limit, limit), "
      "y = (u + 1) * g * sigmoid(alpha * g). alpha finite, limit finite and > 0. f32 math, one "
      "rounding.";
  static void check(const TV& y, const TV& x, double alpha, double limit);
};

struct SwigluoaiAndMulBackward {
  static constexpr const char* name = "swigluoai_and_mul_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x, double alpha, double limit);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"x", ArgRole::in},
                                     {"alpha", ArgRole::scalar, "1.702"},
                                     {"limit", ArgRole::scalar, "7.0"}};
  static constexpr const char* doc =
      "Backward of swigluoai_and_mul, interleaved like x: with s = sigmoid(alpha g), "
      "dx[..., 0::2] = dy * (u + 1) * s * (1 + alpha g (1 - s)) where x_gate <= limit else 0, "
      "dx[..., 1::2] = dy * g * s where -limit <= x_up <= limit else 0 (torch.clamp's gradient).";
  static void check(const TV& dx, const TV& dy, const TV& x, double alpha, double limit);
};

// ---- pointwise: y = f(x) -------------------------------------------------------------------

// One pointwise op without scalars: Name, its name, its math.
#define OPFORGE_POINTWISE_OP(Name, op_name, math, grad_math)                                \
  struct Name {                                                                             \
    static constexpr const char* name = op_name;                                            \
    static constexpr const char* backward = op_name "_backward";                            \
    using Signature = void(const TV& y, const TV& x);                                       \
    static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};            \
    static constexpr const char* doc = math;                                                \
    static void check(const TV& y, const TV& x);                                            \
  };                                                                                        \
  struct Name##Backward {                                                                   \
    static constexpr const char* name = op_name "_backward";                                \
    using Signature = void(const TV& dx, const TV& dy, const TV& x);                        \
    static constexpr ArgSpec args[] = {                                                     \
        {"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in}};                     \
    static constexpr const char* doc = grad_math;                                           \
    static void check(const TV& dx, const TV& dy, const TV& x);                             \
  };

OPFORGE_POINTWISE_OP(GeluNew, "gelu_new",
                     "y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2, vLLM's "
                     "NewGELU); y may be x (in place). f32 math, one rounding.",
                     "Backward of gelu_new: dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) "
                     "(1 + 3 * 0.044715 x^2)), t = tanh(sqrt(2/pi) (x + 0.044715 x^3)); dx may "
                     "be dy (in place).")
OPFORGE_POINTWISE_OP(GeluFast, "gelu_fast",
                     "y = 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2))) (vLLM's FastGELU: "
                     "gelu_new's function with the constant rounded to 10 digits); y may be x.",
                     "Backward of gelu_fast: gelu_new's derivative with c = 0.7978845608; dx may "
                     "be dy (in place).")
OPFORGE_POINTWISE_OP(QuickGelu, "quick_gelu",
                     "y = x * sigmoid(1.702 x) (vLLM's QuickGELU, CUDA op gelu_quick); y may be x.",
                     "Backward of quick_gelu: dx = dy * s (1 + 1.702 x (1 - s)), "
                     "s = sigmoid(1.702 x); dx may be dy (in place).")
OPFORGE_POINTWISE_OP(Relu2, "relu2",
                     "y = max(x, 0)^2 (vLLM's ReLUSquaredActivation, Liger's relu_squared); y may "
                     "be x (in place).",
                     "Backward of relu2: dx = 2 max(x, 0) dy (Liger's relu_squared); dx may be dy.")
#undef OPFORGE_POINTWISE_OP

struct Xielu {
  static constexpr const char* name = "xielu";
  static constexpr const char* backward = "xielu_backward";
  using Signature = void(const TV& y, const TV& x, double alpha_p, double alpha_n, double beta,
                         double eps);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"alpha_p", ArgRole::scalar, "0.8"},
                                     {"alpha_n", ArgRole::scalar, "0.8"},
                                     {"beta", ArgRole::scalar, "0.5"},
                                     {"eps", ArgRole::scalar, "-1e-6"}};
  static constexpr const char* doc =
      "y = alpha_p x^2 + beta x for x > 0, (expm1(min(x, eps)) - x) alpha_n + beta x otherwise "
      "(vLLM's XIELU). alpha_p and alpha_n are the effective values: vLLM stores parameters p, n "
      "with alpha_p = softplus(p), alpha_n = beta + softplus(n), so its defaults (0.8, 0.8) are "
      "this op's defaults; the caller applies softplus. Scalars finite, eps <= 0. y may be x.";
  static void check(const TV& y, const TV& x, double alpha_p, double alpha_n, double beta,
                    double eps);
};

struct XieluBackward {
  static constexpr const char* name = "xielu_backward";
  using Signature = void(const TV& dx, const TV& dy, const TV& x, double alpha_p, double alpha_n,
                         double beta, double eps);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"x", ArgRole::in},
                                     {"alpha_p", ArgRole::scalar, "0.8"},
                                     {"alpha_n", ArgRole::scalar, "0.8"},
                                     {"beta", ArgRole::scalar, "0.5"},
                                     {"eps", ArgRole::scalar, "-1e-6"}};
  static constexpr const char* doc =
      "Backward of xielu with respect to x (the scalars get no gradient): dx = dy * (2 alpha_p x "
      "+ beta) for x > 0, dy * (alpha_n (e^x - 1) + beta) for x < eps, dy * (beta - alpha_n) "
      "otherwise; dx may be dy (in place).";
  static void check(const TV& dx, const TV& dy, const TV& x, double alpha_p, double alpha_n,
                    double beta, double eps);
};

// ---- reference kernels (reference.cpp) --------------------------------------------------------
void silu_and_mul_reference(const Context&, const TV& y, const TV& x);
void silu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void mul_and_silu_reference(const Context&, const TV& y, const TV& x);
void mul_and_silu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void gelu_and_mul_reference(const Context&, const TV& y, const TV& x, std::string_view approximate);
void gelu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                                     std::string_view approximate);
void fatrelu_and_mul_reference(const Context&, const TV& y, const TV& x, double threshold);
void fatrelu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                                        double threshold);
void swigluoai_and_mul_reference(const Context&, const TV& y, const TV& x, double alpha,
                                 double limit);
void swigluoai_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy,
                                          const TV& x, double alpha, double limit);
void gelu_new_reference(const Context&, const TV& y, const TV& x);
void gelu_new_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void gelu_fast_reference(const Context&, const TV& y, const TV& x);
void gelu_fast_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void quick_gelu_reference(const Context&, const TV& y, const TV& x);
void quick_gelu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void relu2_reference(const Context&, const TV& y, const TV& x);
void relu2_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x);
void xielu_reference(const Context&, const TV& y, const TV& x, double alpha_p, double alpha_n,
                     double beta, double eps);
void xielu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                              double alpha_p, double alpha_n, double beta, double eps);

void register_activation(Registry& reg);
void register_activation_cuda(Registry& reg);

}  // namespace opforge
