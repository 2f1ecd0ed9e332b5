// Layernorm family: layer_norm, group_norm, dyt (Dynamic Tanh) and their backward ops.
//
// Greppable chain: op `layer_norm` -> layer_norm_reference (reference.cpp), layer_norm_cpu
// (cpu.cpp); `dyt` -> dyt_reference, dyt_cpu (cpu_dyt.cpp). Cases in cases.cpp, checks / shapes /
// costs in layernorm.cpp. layer_norm and dyt follow Note [row layout] (ops/norm/norm.h);
// group_norm wants contiguous tensors (a group is one contiguous run of elements).
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct LayerNorm {
  static constexpr const char* name = "layer_norm";
  static constexpr const char* backward = "layer_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w,
                         const TensorView& b, double eps);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"b", ArgRole::opt_in},
                                     {"eps", ArgRole::scalar, "1e-5"}};
  static constexpr const char* doc =
      "y = (x - mean) / sqrt(var + eps) * w + b over the last dim, var the biased (population) "
      "variance; b may be none (no bias). x, y: [..., hidden]; w, b: [hidden]; one floating "
      "dtype. Statistics and the affine step in f32 (f64 for f64), one rounding per output, as "
      "torch's F.layer_norm and Liger's kernel. Differs from Liger: no per-row mean / rstd is "
      "stored (Liger stores them in the input dtype); the backward recomputes them in f32. "
      "Default eps 1e-5 as torch.nn.LayerNorm (Liger's module uses 1e-6). y may alias x exactly "
      "(in place).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, double eps);
};

struct LayerNormBackward {
  static constexpr const char* name = "layer_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const TensorView& dy, const TensorView& x, const TensorView& w,
                         double eps);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dw", ArgRole::out},
                                     {"db", ArgRole::out}, {"dy", ArgRole::in},
                                     {"x", ArgRole::in},   {"w", ArgRole::in},
                                     {"eps", ArgRole::scalar, "1e-5"}};
  static constexpr const char* doc =
      "Backward of layer_norm. With xhat = (x - mean) * rstd and g = dy * w: "
      "dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dw = sum over rows of dy * xhat, "
      "db = sum over rows of dy (written whether or not the forward had a bias). mean and rstd "
      "are recomputed from x. dw and db: f32 partial rows per chunk of rows, added in a fixed "
      "order in f64 and rounded once (deterministic, independent of the thread count).";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                    const TensorView& dy, const TensorView& x, const TensorView& w, double eps);
};

struct GroupNorm {
  static constexpr const char* name = "group_norm";
  static constexpr const char* backward = "group_norm_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w,
                         const TensorView& b, int64_t num_groups, double eps);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"b", ArgRole::in},
                                     {"num_groups", ArgRole::scalar, "32"},
                                     {"eps", ArgRole::scalar, "1e-5"}};
  static constexpr const char* doc =
      "torch's F.group_norm: x: [N, C, *] contiguous, num_groups divides C; each (n, group) of "
      "C / num_groups channels x all trailing positions is normalised with its own mean and "
      "biased variance, then y = xhat * w[c] + b[c] with per-channel w, b: [C]. Statistics in "
      "f32 (f64 for f64), one rounding per output. Differs from Liger: Liger uses the one-pass "
      "E[x^2] - E[x]^2 variance and needs x as [N, C, hidden]; opforge takes any trailing dims "
      "and centres before squaring (two passes, as the reference). w and b are required (torch allows none). "
      "y may alias x exactly (in place).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, int64_t num_groups, double eps);
};

struct GroupNormBackward {
  static constexpr const char* name = "group_norm_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const TensorView& dy, const TensorView& x, const TensorView& w,
                         int64_t num_groups, double eps);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},
                                     {"dw", ArgRole::out},
                                     {"db", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"x", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"num_groups", ArgRole::scalar, "32"},
                                     {"eps", ArgRole::scalar, "1e-5"}};
  static constexpr const char* doc =
      "Backward of group_norm: layer_norm's backward over each (n, group) with g = dy * w[c]: "
      "dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw[c] = sum over n and positions of "
      "dy * xhat, db[c] = sum of dy. Differs from Liger (atomic adds in the parameter dtype): "
      "dw and db are f32 sums per (n, channel), added over n in a fixed order in f64 "
      "(deterministic).";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                    const TensorView& dy, const TensorView& x, const TensorView& w,
                    int64_t num_groups, double eps);
};

struct Dyt {
  static constexpr const char* name = "dyt";
  static constexpr const char* backward = "dyt_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& alpha,
                         const TensorView& gamma, const TensorView& beta);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"alpha", ArgRole::in},
                                     {"gamma", ArgRole::in},
                                     {"beta", ArgRole::opt_in}};
  static constexpr const char* doc =
      "Dynamic Tanh (Zhu et al. 2025), Liger's dyt: y = gamma * tanh(alpha * x) + beta over "
      "the last dim. x, y: [..., hidden]; alpha: [1] (a learnable scalar held as a tensor); "
      "gamma, beta: [hidden]; beta may be none; one floating dtype. Computed in f32 (f64 for "
      "f64) with one rounding per output, as Liger. y may alias x exactly (in place).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& alpha,
                    const TensorView& gamma, const TensorView& beta);
};

struct DytBackward {
  static constexpr const char* name = "dyt_backward";
  using Signature = void(const TensorView& dx, const TensorView& dalpha, const TensorView& dgamma,
                         const TensorView& dbeta, const TensorView& dy, const TensorView& x,
                         const TensorView& alpha, const TensorView& gamma);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},    {"dalpha", ArgRole::out},
                                     {"dgamma", ArgRole::out}, {"dbeta", ArgRole::out},
                                     {"dy", ArgRole::in},     {"x", ArgRole::in},
                                     {"alpha", ArgRole::in},  {"gamma", ArgRole::in}};
  static constexpr const char* doc =
      "Backward of dyt, with t = tanh(alpha * x): dx = alpha * gamma * (1 - t^2) * dy; "
      "dalpha = sum over all elements of x * gamma * (1 - t^2) * dy; dgamma = sum over rows of "
      "dy * t; dbeta = sum over rows of dy (written whether or not the forward had beta). "
      "f32 partials per chunk of rows, added in a fixed order in f64 (deterministic; Liger "
      "sums per-SM partials in torch).";
  static void check(const TensorView& dx, const TensorView& dalpha, const TensorView& dgamma,
                    const TensorView& dbeta, const TensorView& dy, const TensorView& x,
                    const TensorView& alpha, const TensorView& gamma);
};

// Reference kernels (one symbol per op x backend).
void layer_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b, double eps);
void layer_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                   const TensorView& db, const TensorView& dy, const TensorView& x,
                                   const TensorView& w, double eps);
void group_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b, int64_t num_groups, double eps);
void group_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                   const TensorView& db, const TensorView& dy, const TensorView& x,
                                   const TensorView& w, int64_t num_groups, double eps);
void dyt_reference(const Context&, const TensorView& y, const TensorView& x,
                   const TensorView& alpha, const TensorView& gamma, const TensorView& beta);
void dyt_backward_reference(const Context&, const TensorView& dx, const TensorView& dalpha,
                            const TensorView& dgamma, const TensorView& dbeta,
                            const TensorView& dy, const TensorView& x, const TensorView& alpha,
                            const TensorView& gamma);

void register_layernorm(Registry& reg);  // layernorm.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
