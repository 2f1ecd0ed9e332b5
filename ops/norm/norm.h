// Norm family: rms_norm, fused_add_rms_norm and their backward ops.
//
// Greppable chain: op `rms_norm` -> rms_norm_reference (reference.cpp), rms_norm_cpu (cpu.cpp),
// rms_norm_cuda (cuda.cu). Cases in cases.cpp, checks / shapes / costs in norm.cpp.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// Note [row layout]: row-wise ops view a tensor as rows x hidden where hidden is the last dim.
// The last dim must have stride 1 and the rows one uniform stride (TensorView::rows_are_uniform),
// so rows may be padded ("strided rows") but not transposed.

struct RmsNorm {
  static constexpr const char* name = "rms_norm";
  static constexpr const char* backward = "rms_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w, double eps,
                         double offset);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-6"},
                                     {"offset", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "y = x / sqrt(mean(x^2) + eps) * (w + offset), over the last dim. x, y: [..., hidden], "
      "w: [hidden], one floating dtype. Accumulates in f32 (f64 for f64) and rounds once at the "
      "end; offset = 1 gives Gemma's (1 + w). Differs from vLLM's rms_norm, which rounds x*rstd "
      "to the input dtype before multiplying by w (Liger's 'llama' casting mode): opforge computes "
      "Liger's 'gemma' casting mode for every offset. y may alias x exactly (in place).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w, double eps,
                    double offset);
};

struct RmsNormBackward {
  static constexpr const char* name = "rms_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                         const TensorView& x, const TensorView& w, double eps, double offset);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},     {"dw", ArgRole::out},
                                     {"dy", ArgRole::in},      {"x", ArgRole::in},
                                     {"w", ArgRole::in},       {"eps", ArgRole::scalar, "1e-6"},
                                     {"offset", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "Backward of rms_norm. With r = 1/sqrt(mean(x^2) + eps) and m = dy * (w + offset): "
      "dx = r*m - (r^3 / hidden) * sum(m*x) * x, dw = sum over rows of dy * x * r. dw is "
      "reduced in f32 in a fixed order (deterministic).";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                    const TensorView& x, const TensorView& w, double eps, double offset);
};

struct FusedAddRmsNorm {
  static constexpr const char* name = "fused_add_rms_norm";
  static constexpr const char* backward = "fused_add_rms_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& s, const TensorView& x,
                         const TensorView& residual, const TensorView& w, double eps,
                         double offset);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},        {"s", ArgRole::out},
                                     {"x", ArgRole::in},         {"residual", ArgRole::in},
                                     {"w", ArgRole::in},         {"eps", ArgRole::scalar, "1e-6"},
                                     {"offset", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "s = x + residual (rounded to the dtype, as the residual stream is stored); "
      "y = rms_norm(s, w, eps, offset) computed from the rounded s. vLLM's in-place form is "
      "y aliasing x and s aliasing residual, both allowed (exact aliases only).";
  static void check(const TensorView& y, const TensorView& s, const TensorView& x,
                    const TensorView& residual, const TensorView& w, double eps, double offset);
};

struct FusedAddRmsNormBackward {
  static constexpr const char* name = "fused_add_rms_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dresidual, const TensorView& dw,
                         const TensorView& dy, const TensorView& ds, const TensorView& x,
                         const TensorView& residual, const TensorView& w, double eps,
                         double offset);
  static constexpr ArgSpec args[] = {
      {"dx", ArgRole::out}, {"dresidual", ArgRole::out}, {"dw", ArgRole::out},
      {"dy", ArgRole::in},  {"ds", ArgRole::in},         {"x", ArgRole::in},
      {"residual", ArgRole::in}, {"w", ArgRole::in},     {"eps", ArgRole::scalar, "1e-6"},
      {"offset", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "Backward of fused_add_rms_norm: dx = dresidual = rms_norm_backward(dy; s) + ds with "
      "s = x + residual recomputed; dw as in rms_norm_backward.";
  static void check(const TensorView& dx, const TensorView& dresidual, const TensorView& dw,
                    const TensorView& dy, const TensorView& ds, const TensorView& x,
                    const TensorView& residual, const TensorView& w, double eps, double offset);
};

// Kernels (one symbol per op x backend).
void rms_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                        const TensorView& w, double eps, double offset);
void rms_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                 const TensorView& dy, const TensorView& x, const TensorView& w,
                                 double eps, double offset);
void fused_add_rms_norm_reference(const Context&, const TensorView& y, const TensorView& s,
                                  const TensorView& x, const TensorView& residual,
                                  const TensorView& w, double eps, double offset);
void fused_add_rms_norm_backward_reference(const Context&, const TensorView& dx,
                                           const TensorView& dresidual, const TensorView& dw,
                                           const TensorView& dy, const TensorView& ds,
                                           const TensorView& x, const TensorView& residual,
                                           const TensorView& w, double eps, double offset);

void register_norm(Registry& reg);       // norm.cpp: ops, reference + cpu kernels, cases
void register_norm_cuda(Registry& reg);  // cuda.cu (a stub that registers nothing without CUDA)

}  // namespace opforge
