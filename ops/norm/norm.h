// Norm family: rms_norm, fused_add_rms_norm and their backward ops.
//
// Greppable chain: op `rms_norm` -> rms_norm_reference (reference.cpp), rms_norm_cpu (cpu.cpp),
// rms_norm_cuda (cuda.cu). Cases in cases.cpp, checks / shapes / costs in norm.cpp.
#pragma once

#include <string_view>

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

// ---- Gemma's RMSNorm -------------------------------------------------------------------------
// The same function as rms_norm with offset = 1 (opforge's rms_norm already keeps x * rstd in f32
// up to the gain, i.e. Liger's 'gemma' casting mode), under the name vLLM and Gemma users look for.

struct GemmaRmsNorm {
  static constexpr const char* name = "gemma_rms_norm";
  static constexpr const char* backward = "gemma_rms_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w, double eps);
  static constexpr ArgSpec args[] = {
      {"y", ArgRole::out}, {"x", ArgRole::in}, {"w", ArgRole::in}, {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "Gemma's RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w) over the last dim, all in f32 "
      "(f64 for f64), rounded to the dtype once at the end (vLLM GemmaRMSNorm: (x * w).to(dtype), "
      "not x.to(dtype) * w). Same values as rms_norm(offset=1); vLLM's rms_norm (RMSNorm) differs: "
      "it rounds x*rstd to the dtype before multiplying by w, and takes w, not 1 + w. x, y: "
      "[..., hidden], w: [hidden] (Gemma initialises it to zeros). y may alias x exactly.";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w, double eps);
};

struct GemmaRmsNormBackward {
  static constexpr const char* name = "gemma_rms_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                         const TensorView& x, const TensorView& w, double eps);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dw", ArgRole::out},
                                     {"dy", ArgRole::in},  {"x", ArgRole::in},
                                     {"w", ArgRole::in},   {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "Backward of gemma_rms_norm: rms_norm_backward with offset = 1. With r = rsqrt(mean(x^2) + "
      "eps) and m = dy * (1 + w): dx = r*m - (r^3 / hidden) * sum(m*x) * x, dw = sum over rows of "
      "dy * x * r (deterministic f32 reduction).";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                    const TensorView& x, const TensorView& w, double eps);
};

struct GemmaFusedAddRmsNorm {
  static constexpr const char* name = "gemma_fused_add_rms_norm";
  static constexpr const char* backward = "gemma_fused_add_rms_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& s, const TensorView& x,
                         const TensorView& residual, const TensorView& w, double eps);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},        {"s", ArgRole::out},
                                     {"x", ArgRole::in},         {"residual", ArgRole::in},
                                     {"w", ArgRole::in},         {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "s = x + residual rounded to the dtype; y = gemma_rms_norm(s, w, eps) from the rounded s "
      "(fused_add_rms_norm with offset = 1). vLLM's GemmaRMSNorm with a residual rounds the sum "
      "the same way for bf16 and f32 but keeps it in f32 for f16 inputs; opforge rounds for every "
      "dtype (the residual stream is stored in the dtype). y may alias x and s may alias "
      "residual (exact aliases only).";
  static void check(const TensorView& y, const TensorView& s, const TensorView& x,
                    const TensorView& residual, const TensorView& w, double eps);
};

struct GemmaFusedAddRmsNormBackward {
  static constexpr const char* name = "gemma_fused_add_rms_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dresidual, const TensorView& dw,
                         const TensorView& dy, const TensorView& ds, const TensorView& x,
                         const TensorView& residual, const TensorView& w, double eps);
  static constexpr ArgSpec args[] = {
      {"dx", ArgRole::out}, {"dresidual", ArgRole::out}, {"dw", ArgRole::out},
      {"dy", ArgRole::in},  {"ds", ArgRole::in},         {"x", ArgRole::in},
      {"residual", ArgRole::in}, {"w", ArgRole::in},     {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "Backward of gemma_fused_add_rms_norm: fused_add_rms_norm_backward with offset = 1; "
      "dx = dresidual = gemma_rms_norm_backward(dy; s) + ds.";
  static void check(const TensorView& dx, const TensorView& dresidual, const TensorView& dw,
                    const TensorView& dy, const TensorView& ds, const TensorView& x,
                    const TensorView& residual, const TensorView& w, double eps);
};

// ---- Gated RMSNorm (Mamba-2 / FLA RMSNormGated) ------------------------------------------------

struct RmsNormGated {
  static constexpr const char* name = "rms_norm_gated";
  static constexpr const char* backward = "rms_norm_gated_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& z,
                         const TensorView& w, double eps, int64_t group_size, bool norm_before_gate,
                         std::string_view activation);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"z", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-5"},
                                     {"group_size", ArgRole::scalar, "0"},
                                     {"norm_before_gate", ArgRole::scalar, "false"},
                                     {"activation", ArgRole::scalar, "silu"}};
  static constexpr const char* doc =
      "Gated RMSNorm, all in f32 (f64 for f64), rounded once at the end. act = silu (z * "
      "sigmoid(z); 'swish' is accepted as its other name) or sigmoid. norm_before_gate = false: "
      "u = x * act(z), y = u * rsqrt(mean(u^2) + eps) * w. norm_before_gate = true: y = x * "
      "rsqrt(mean(x^2) + eps) * w * act(z). The mean runs over groups of group_size consecutive "
      "elements of the last dim (0: the whole last dim; it must divide hidden). x, z, y: [..., "
      "hidden], w: [hidden]. Matches vLLM's RMSNormGated native path and FLA's rmsnorm_fn "
      "(whose default eps is 1e-5 too; vLLM's default activation is 'swish', the same function). "
      "z is required: without a gate use rms_norm. y may alias x exactly.";
  static void check(const TensorView& y, const TensorView& x, const TensorView& z,
                    const TensorView& w, double eps, int64_t group_size, bool norm_before_gate,
                    std::string_view activation);
};

struct RmsNormGatedBackward {
  static constexpr const char* name = "rms_norm_gated_backward";
  using Signature = void(const TensorView& dx, const TensorView& dz, const TensorView& dw,
                         const TensorView& dy, const TensorView& x, const TensorView& z,
                         const TensorView& w, double eps, int64_t group_size,
                         bool norm_before_gate, std::string_view activation);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},
                                     {"dz", ArgRole::out},
                                     {"dw", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"x", ArgRole::in},
                                     {"z", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-5"},
                                     {"group_size", ArgRole::scalar, "0"},
                                     {"norm_before_gate", ArgRole::scalar, "false"},
                                     {"activation", ArgRole::scalar, "silu"}};
  static constexpr const char* doc =
      "Backward of rms_norm_gated, per group with r the group's rstd. Gate first (u = x*act(z)): "
      "du = r*m - (r^3/G) * sum(m*u) * u with m = dy*w, dx = du * act(z), dz = du * x * act'(z), "
      "dw = sum over rows of dy * u * r. Norm first (n = x*r*w): g = dy*act(z), dz = dy * n * "
      "act'(z), dx = r*m - (r^3/G) * sum(m*x) * x with m = g*w, dw = sum over rows of g * x * r. "
      "dw is reduced in f32 in a fixed order (deterministic).";
  static void check(const TensorView& dx, const TensorView& dz, const TensorView& dw,
                    const TensorView& dy, const TensorView& x, const TensorView& z,
                    const TensorView& w, double eps, int64_t group_size, bool norm_before_gate,
                    std::string_view activation);
};

// ---- PolyNorm (PolyCom, arXiv 2411.03884) --------------------------------------------------------

struct PolyNorm {
  static constexpr const char* name = "poly_norm";
  static constexpr const char* backward = "poly_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w,
                         const TensorView& b, double eps);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"b", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "y = w[0] * N(x^3) + w[1] * N(x^2) + w[2] * N(x) + b[0], N(u) = u * rsqrt(mean(u^2) + eps) "
      "over the last dim; all in f32 (f64 for f64), rounded once. x, y: [..., hidden], w: [3], "
      "b: [1], of x's dtype. Liger's PolyNorm and vLLM's poly_norm compute the same function; "
      "Liger overwrites x with the gradient in its backward by default (in_place=True), opforge's "
      "backward writes dx separately. y may alias x exactly.";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, double eps);
};

struct PolyNormBackward {
  static constexpr const char* name = "poly_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const TensorView& dy, const TensorView& x, const TensorView& w,
                         double eps);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dw", ArgRole::out},
                                     {"db", ArgRole::out}, {"dy", ArgRole::in},
                                     {"x", ArgRole::in},   {"w", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-6"}};
  static constexpr const char* doc =
      "Backward of poly_norm. For p = 3, 2, 1 (weights w[0], w[1], w[2]) with r_p = rsqrt(mean("
      "x^(2p)) + eps) and S_p = sum(dy * x^p) over the row: dx = sum_p w_p * (p * x^(p-1) * dy * "
      "r_p - (p / hidden) * x^(2p-1) * r_p^3 * S_p); dw_p = sum over rows of r_p * S_p; db = "
      "sum of dy. dw and db are reduced in a fixed order (deterministic).";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                    const TensorView& dy, const TensorView& x, const TensorView& w, double eps);
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

// Gated and poly norms: reference_variants.cpp.
void rms_norm_gated_reference(const Context&, const TensorView& y, const TensorView& x,
                              const TensorView& z, const TensorView& w, double eps,
                              int64_t group_size, bool norm_before_gate,
                              std::string_view activation);
void rms_norm_gated_backward_reference(const Context&, const TensorView& dx, const TensorView& dz,
                                       const TensorView& dw, const TensorView& dy,
                                       const TensorView& x, const TensorView& z,
                                       const TensorView& w, double eps, int64_t group_size,
                                       bool norm_before_gate, std::string_view activation);
void poly_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                         const TensorView& w, const TensorView& b, double eps);
void poly_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                  const TensorView& db, const TensorView& dy, const TensorView& x,
                                  const TensorView& w, double eps);

void register_norm(Registry& reg);       // norm.cpp: ops, reference + cpu kernels, cases
void register_norm_cuda(Registry& reg);  // cuda.cu (a stub that registers nothing without CUDA)

}  // namespace opforge
