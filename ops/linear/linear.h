// Linear family: linear, fused_linear_cross_entropy and their backward ops.
//
// Greppable chain: op `linear` -> linear_reference (reference.cpp), linear_cpu (cpu.cpp);
// op `fused_linear_cross_entropy` -> fused_linear_cross_entropy_reference (reference.cpp),
// fused_linear_cross_entropy_cpu (flce_cpu.cpp); `fused_linear_cross_entropy_with_grad` ->
// fused_linear_cross_entropy_with_grad_reference / _cpu (the two ops' kernels in turn). Cases in
// cases.cpp, checks / shapes / costs in linear.cpp. Matrices follow Note [row layout] (ops/norm/norm.h): unit-stride rows, any uniform
// row stride, so padded rows are accepted everywhere.
#pragma once

#include <string_view>

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct Linear {
  static constexpr const char* name = "linear";
  static constexpr const char* backward = "linear_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w,
                         const TensorView& b);
  static constexpr ArgSpec args[] = {
      {"y", ArgRole::out}, {"x", ArgRole::in}, {"w", ArgRole::in}, {"b", ArgRole::opt_in}};
  static constexpr const char* doc =
      "y = x @ w^T + b, as torch.nn.functional.linear. x: [..., in], w: [out, in], b: [out] or "
      "none, y: [..., out]; one floating dtype. Sums in f32 (f64 for f64) and rounds once; the "
      "bias is added before that rounding (vLLM's unquantized linear adds it in the GEMM "
      "epilogue too). in = 0 gives y = b (or 0).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b);
};

struct LinearBackward {
  static constexpr const char* name = "linear_backward";
  using Signature = void(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const TensorView& dy, const TensorView& x, const TensorView& w);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dw", ArgRole::out},
                                     {"db", ArgRole::out}, {"dy", ArgRole::in},
                                     {"x", ArgRole::in},   {"w", ArgRole::in}};
  static constexpr const char* doc =
      "Backward of linear: dx = dy @ w, dw = dy^T @ x, db = sum over rows of dy (always "
      "written; ignore it when the forward had no bias). Sums in f32 in a fixed order, so "
      "results do not depend on the thread count.";
  static void check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                    const TensorView& dy, const TensorView& x, const TensorView& w);
};

// Note [flce semantics]: the loss is torch.nn.functional.cross_entropy(hidden @ w^T + b, target,
// ignore_index, label_smoothing, reduction) with the logits kept in f32 (f64 for f64), never
// rounded to the input dtype. Per token n with target t != ignore_index, over V classes:
//   lse_n = log(sum_v exp(z_nv)),
//   loss_n = (1 - ls) * (lse_n - z_nt) + ls * (lse_n - mean_v z_nv),
//   dloss_n/dz_nv = softmax(z_n)_v - (1 - ls) * [v == t] - ls / V;
// ignored tokens have loss 0 and gradient 0. reduction: none -> loss[n]; sum -> sum_n loss_n;
// mean -> sum / (number of tokens not ignored), and 0 (not PyTorch's NaN) when every token is
// ignored. The kernels evaluate the logits in blocks (Note [flce chunks], flce_cpu.cpp;
// Note [flce cuda blocks], flce_cuda.cu). Targets are range-checked when they are cpu tensors;
// reading CUDA targets would synchronize, so there a target outside [0, V) other than
// ignore_index gives that token a NaN loss and NaN gradients instead (as cross_entropy's).
struct FusedLinearCrossEntropy {
  static constexpr const char* name = "fused_linear_cross_entropy";
  static constexpr const char* backward = "fused_linear_cross_entropy_backward";
  using Signature = void(const TensorView& loss, const TensorView& lse, const TensorView& hidden,
                         const TensorView& w, const TensorView& target, const TensorView& b,
                         int64_t ignore_index, double label_smoothing, std::string_view reduction);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"lse", ArgRole::out},
                                     {"hidden", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"b", ArgRole::opt_in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "Cross-entropy of logits = hidden @ w^T + b without materialising the [tokens, vocab] "
      "logits (Liger's fused_linear_cross_entropy). hidden: [tokens, H], w: [V, H], b: [V] or "
      "none, target: int64 [tokens], each in [0, V) or equal to ignore_index. reduction none / "
      "sum / mean; label_smoothing in [0, 1]. loss: [tokens] for none, a 0-d tensor otherwise, "
      "f32 (f64 when hidden is f64). lse: [tokens], the log-sum-exp of each token's logits, "
      "written for every token (ignored ones too; the backward reads it), loss's dtype. Note "
      "[flce semantics]: logits are kept in f32 (Liger rounds them to the input dtype); mean over "
      "zero counted tokens is 0 (PyTorch: NaN). No z-loss, softcap or class weights.";
  static void check(const TensorView& loss, const TensorView& lse, const TensorView& hidden,
                    const TensorView& w, const TensorView& target, const TensorView& b,
                    int64_t ignore_index, double label_smoothing, std::string_view reduction);
};

struct FusedLinearCrossEntropyBackward {
  static constexpr const char* name = "fused_linear_cross_entropy_backward";
  using Signature = void(const TensorView& dhidden, const TensorView& dw, const TensorView& db,
                         const TensorView& dloss, const TensorView& hidden, const TensorView& w,
                         const TensorView& target, const TensorView& lse, const TensorView& b,
                         int64_t ignore_index, double label_smoothing, std::string_view reduction);
  static constexpr ArgSpec args[] = {{"dhidden", ArgRole::out},
                                     {"dw", ArgRole::out},
                                     {"db", ArgRole::out},
                                     {"dloss", ArgRole::in},
                                     {"hidden", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"lse", ArgRole::in},
                                     {"b", ArgRole::opt_in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "Backward of fused_linear_cross_entropy: with G[n, v] = g_n * dloss_n/dz_nv (Note [flce "
      "semantics]) and g_n = dloss[n] (none), dloss (sum) or dloss / counted tokens (mean): "
      "dhidden = G @ w, dw = G^T @ hidden, db = sum over tokens of G (always written). lse: the "
      "forward's lse output (any floating dtype); softmax(z_n)_v is taken as exp(z_nv - lse_n), so "
      "the logits are recomputed block by block without another pass for their normaliser. "
      "dloss: the loss's shape, any floating dtype.";
  static void check(const TensorView& dhidden, const TensorView& dw, const TensorView& db,
                    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
                    const TensorView& target, const TensorView& lse, const TensorView& b,
                    int64_t ignore_index, double label_smoothing, std::string_view reduction);
};

// fused_linear_cross_entropy and its backward in one call, for a training step whose upstream
// gradient is known before the loss (Liger's form: 1 for a loss that is only backpropagated).
struct FusedLinearCrossEntropyWithGrad {
  static constexpr const char* name = "fused_linear_cross_entropy_with_grad";
  using Signature = void(const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
                         const TensorView& dw, const TensorView& db, const TensorView& hidden,
                         const TensorView& w, const TensorView& target, const TensorView& dloss,
                         const TensorView& b, int64_t ignore_index, double label_smoothing,
                         std::string_view reduction);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"lse", ArgRole::out},
                                     {"dhidden", ArgRole::out},
                                     {"dw", ArgRole::out},
                                     {"db", ArgRole::out},
                                     {"hidden", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"dloss", ArgRole::in},
                                     {"b", ArgRole::opt_in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "fused_linear_cross_entropy and fused_linear_cross_entropy_backward in one call: loss and "
      "lse as the forward writes them, dhidden, dw and db as the backward writes them for the "
      "given dloss (the loss's shape, any floating dtype: pass 1 for a mean loss that is only "
      "backpropagated). Liger's fused_linear_cross_entropy computes its gradients in the forward "
      "this way; here the upstream gradient is an input, so no later rescaling pass is needed. "
      "Note [flce semantics]: logits kept in f32 (Liger rounds them to the input dtype), mean over "
      "zero counted tokens is 0. A kernel that holds a token block's whole row of logits computes "
      "them once (three GEMMs, the unfused form's count) where the two ops compute them twice.";
  static void check(const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
                    const TensorView& dw, const TensorView& db, const TensorView& hidden,
                    const TensorView& w, const TensorView& target, const TensorView& dloss,
                    const TensorView& b, int64_t ignore_index, double label_smoothing,
                    std::string_view reduction);
};

// Kernels (one symbol per op x backend).
void linear_reference(const Context&, const TensorView& y, const TensorView& x,
                      const TensorView& w, const TensorView& b);
void linear_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                               const TensorView& db, const TensorView& dy, const TensorView& x,
                               const TensorView& w);
void fused_linear_cross_entropy_reference(const Context&, const TensorView& loss,
                                          const TensorView& lse, const TensorView& hidden,
                                          const TensorView& w,
                                          const TensorView& target, const TensorView& b,
                                          int64_t ignore_index, double label_smoothing,
                                          std::string_view reduction);
void fused_linear_cross_entropy_backward_reference(
    const Context&, const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& lse, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction);

void fused_linear_cross_entropy_with_grad_reference(
    const Context&, const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
    const TensorView& dw, const TensorView& db, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& dloss, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction);

void register_linear(Registry& reg);  // linear.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
