// Loss family: cross_entropy, kl_div, jsd, tvd and their backward ops, and
// cross_entropy_with_grad (cross_entropy and its backward in one pass).
//
// Greppable chain: op `cross_entropy` -> cross_entropy_reference (reference.cpp),
// cross_entropy_cpu (cpu.cpp), cross_entropy_cuda* (cuda.cu); `cross_entropy_with_grad` ->
// cross_entropy_with_grad_cuda* (cuda_fused.cu). Checks, shapes and costs in loss.cpp, cases in
// cases.cpp.
// Inputs are [N, V] (tokens x vocabulary) with Note [row layout] (ops/norm/norm.h) rows; ids and
// labels are int64 [N].
//
// Note [loss outputs]: per-token losses and lse are f32 (f64 for f64 inputs) whatever the input
// dtype; element-wise losses (reduction "none" of kl_div and tvd) have the input's dtype; a
// reduced loss is a 1-element tensor [1] of f32 (f64 for f64). A mean over zero counted rows is
// 0 / 0 = NaN, as in PyTorch. Backward ops take dloss of any floating dtype with the shape of
// the forward loss.
#pragma once

#include <string_view>

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct CrossEntropy {
  static constexpr const char* name = "cross_entropy";
  static constexpr const char* backward = "cross_entropy_backward";
  using Signature = void(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                         const TensorView& target, int64_t ignore_index, double label_smoothing,
                         double lse_square_scale, double softcap, std::string_view reduction);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"lse", ArgRole::out},
                                     {"logits", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"lse_square_scale", ArgRole::scalar, "0"},
                                     {"softcap", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "logits [N, V], target int64 [N]. Per row, z = softcap * tanh(logits / softcap) when "
      "softcap > 0 (else z = logits), lse = log(sum(exp(z))), eps = label_smoothing / V and "
      "loss_i = (1 - label_smoothing) * (lse - z[target]) + label_smoothing * lse - eps * sum(z) "
      "+ lse_square_scale * lse^2 (z-loss). Rows whose target is ignore_index have loss 0. "
      "reduction: none (loss [N]), sum or mean (loss [1]; mean divides by the rows not ignored). "
      "lse [N] is written for every row (the backward reads it). loss and lse are f32 (f64 for "
      "f64 logits). Targets outside [0, V) other than ignore_index are an error. Same loss as "
      "Liger's cross_entropy without class weights; PyTorch's cross_entropy for softcap 0 and "
      "lse_square_scale 0. Differs from Liger: softcap 0 means no softcap (Liger: None).";
  static void check(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                    const TensorView& target, int64_t ignore_index, double label_smoothing,
                    double lse_square_scale, double softcap, std::string_view reduction);
};

struct CrossEntropyBackward {
  static constexpr const char* name = "cross_entropy_backward";
  using Signature = void(const TensorView& dlogits, const TensorView& dloss,
                         const TensorView& logits, const TensorView& target, const TensorView& lse,
                         int64_t ignore_index, double label_smoothing, double lse_square_scale,
                         double softcap, std::string_view reduction);
  static constexpr ArgSpec args[] = {{"dlogits", ArgRole::out},
                                     {"dloss", ArgRole::in},
                                     {"logits", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"lse", ArgRole::in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"lse_square_scale", ArgRole::scalar, "0"},
                                     {"softcap", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "Backward of cross_entropy from the saved lse: with p = exp(z - lse) and g the row's "
      "upstream gradient (dloss[i] for none, dloss[0] for sum, dloss[0] / rows not ignored for "
      "mean), dz_j = g * ((1 + 2 * lse_square_scale * lse) * p_j - eps - (1 - label_smoothing) "
      "* [j == target]) and dlogits = dz * (1 - (z / softcap)^2) under a softcap; ignored rows "
      "get 0. The target entry is computed on its own in f32, not as p - 1 read back from a "
      "rounded store. Same gradient as Liger's (computed there inside the forward).";
  static void check(const TensorView& dlogits, const TensorView& dloss, const TensorView& logits,
                    const TensorView& target, const TensorView& lse, int64_t ignore_index,
                    double label_smoothing, double lse_square_scale, double softcap,
                    std::string_view reduction);
};

struct CrossEntropyWithGrad {
  static constexpr const char* name = "cross_entropy_with_grad";
  using Signature = void(const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
                         const TensorView& logits, const TensorView& target, const TensorView& dloss,
                         int64_t ignore_index, double label_smoothing, double lse_square_scale,
                         double softcap, std::string_view reduction);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"lse", ArgRole::out},
                                     {"dlogits", ArgRole::out},
                                     {"logits", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"dloss", ArgRole::in},
                                     {"ignore_index", ArgRole::scalar, "-100"},
                                     {"label_smoothing", ArgRole::scalar, "0"},
                                     {"lse_square_scale", ArgRole::scalar, "0"},
                                     {"softcap", ArgRole::scalar, "0"},
                                     {"reduction", ArgRole::scalar, "mean"}};
  static constexpr const char* doc =
      "cross_entropy and its backward in one call, Liger's fused form (the gradient is computed "
      "inside the forward, so the logits are read once for both): loss and lse are "
      "cross_entropy(logits, target, ...)'s, and dlogits (logits' dtype and shape) is "
      "cross_entropy_backward(dloss, logits, target, lse, ...)'s, with the same options and "
      "math. dloss is the upstream gradient of the loss, given up front: the loss's shape ([N] "
      "for none, [1] for sum and mean), any floating dtype, read on the device (no host "
      "synchronization); mean divides it by the rows not ignored. No backward op: dlogits is "
      "the gradient. Differs from Liger: dlogits is a separate output (Liger overwrites the "
      "logits in place), the upstream gradient is an input rather than a scale applied to the "
      "saved gradient in the backward, lse is returned, and softcap 0 means no softcap.";
  static void check(const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
                    const TensorView& logits, const TensorView& target, const TensorView& dloss,
                    int64_t ignore_index, double label_smoothing, double lse_square_scale,
                    double softcap, std::string_view reduction);
};

struct KlDiv {
  static constexpr const char* name = "kl_div";
  static constexpr const char* backward = "kl_div_backward";
  using Signature = void(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                         bool log_target, std::string_view reduction, double eps);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"y_pred", ArgRole::in},
                                     {"y_true", ArgRole::in},
                                     {"log_target", ArgRole::scalar, "false"},
                                     {"reduction", ArgRole::scalar, "batchmean"},
                                     {"eps", ArgRole::scalar, "1e-10"}};
  static constexpr const char* doc =
      "y_pred = log-probabilities [N, V], y_true probabilities (or log-probabilities with "
      "log_target). Element loss: y_true * (log(max(y_true, eps)) - y_pred), or with log_target "
      "exp(y_true) * (y_true - y_pred). reduction: none ([N, V], input dtype), sum, mean (/ N*V), "
      "batchmean (/ N) ([1], f32). Liger's kl_div (eps clamp, batchmean default); PyTorch's "
      "kl_div uses 0 * log 0 = 0 instead of the eps clamp, which differs only where y_true < eps.";
  static void check(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                    bool log_target, std::string_view reduction, double eps);
};

struct KlDivBackward {
  static constexpr const char* name = "kl_div_backward";
  using Signature = void(const TensorView& dy_pred, const TensorView& dloss,
                         const TensorView& y_true, bool log_target, std::string_view reduction,
                         double eps);
  static constexpr ArgSpec args[] = {{"dy_pred", ArgRole::out},
                                     {"dloss", ArgRole::in},
                                     {"y_true", ArgRole::in},
                                     {"log_target", ArgRole::scalar, "false"},
                                     {"reduction", ArgRole::scalar, "batchmean"},
                                     {"eps", ArgRole::scalar, "1e-10"}};
  static constexpr const char* doc =
      "Backward of kl_div with respect to y_pred: dy_pred = -y_true * g (-exp(y_true) * g with "
      "log_target), g = dloss element-wise for none, dloss[0] (sum), dloss[0] / (N*V) (mean), "
      "dloss[0] / N (batchmean). y_true gets no gradient (as in Liger).";
  static void check(const TensorView& dy_pred, const TensorView& dloss, const TensorView& y_true,
                    bool log_target, std::string_view reduction, double eps);
};

struct Jsd {
  static constexpr const char* name = "jsd";
  static constexpr const char* backward = "jsd_backward";
  using Signature = void(const TensorView& loss, const TensorView& input, const TensorView& target,
                         const TensorView& labels, double beta, int64_t ignore_index);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"input", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"labels", ArgRole::opt_in},
                                     {"beta", ArgRole::scalar, "0.5"},
                                     {"ignore_index", ArgRole::scalar, "-100"}};
  static constexpr const char* doc =
      "Liger's generalised Jensen-Shannon divergence. input = log Q (student), target = log P "
      "(teacher), [N, V]; labels int64 [N] (optional) drop rows equal to ignore_index. With "
      "M = beta P + (1 - beta) Q the element loss is beta P Y + (1 - beta) Q X - M log M "
      "(X = log Q, Y = log P); beta = 0 gives forward KL P (Y - X), beta = 1 reverse KL "
      "Q (X - Y), as in Liger. loss [1] (f32) = sum over kept rows / number of kept rows.";
  static void check(const TensorView& loss, const TensorView& input, const TensorView& target,
                    const TensorView& labels, double beta, int64_t ignore_index);
};

struct JsdBackward {
  static constexpr const char* name = "jsd_backward";
  using Signature = void(const TensorView& dinput, const TensorView& dloss,
                         const TensorView& input, const TensorView& target,
                         const TensorView& labels, double beta, int64_t ignore_index);
  static constexpr ArgSpec args[] = {{"dinput", ArgRole::out},
                                     {"dloss", ArgRole::in},
                                     {"input", ArgRole::in},
                                     {"target", ArgRole::in},
                                     {"labels", ArgRole::opt_in},
                                     {"beta", ArgRole::scalar, "0.5"},
                                     {"ignore_index", ArgRole::scalar, "-100"}};
  static constexpr const char* doc =
      "Backward of jsd with respect to input: g = dloss[0] / kept rows times (1 - beta) Q (X - "
      "log M); -P for beta = 0, Q (X - Y) + Q for beta = 1; ignored rows get 0. The teacher gets "
      "no gradient (as in Liger).";
  static void check(const TensorView& dinput, const TensorView& dloss, const TensorView& input,
                    const TensorView& target, const TensorView& labels, double beta,
                    int64_t ignore_index);
};

struct Tvd {
  static constexpr const char* name = "tvd";
  static constexpr const char* backward = "tvd_backward";
  using Signature = void(const TensorView& loss, const TensorView& p, const TensorView& q,
                         const TensorView& labels, std::string_view reduction,
                         int64_t ignore_index);
  static constexpr ArgSpec args[] = {{"loss", ArgRole::out},
                                     {"p", ArgRole::in},
                                     {"q", ArgRole::in},
                                     {"labels", ArgRole::opt_in},
                                     {"reduction", ArgRole::scalar, "batchmean"},
                                     {"ignore_index", ArgRole::scalar, "-100"}};
  static constexpr const char* doc =
      "Total variation distance, element loss 0.5 |p - q| on [N, V] probabilities; labels int64 "
      "[N] (optional) zero the rows equal to ignore_index. reduction: none ([N, V], input dtype), "
      "sum, mean (/ kept rows * V), batchmean (/ kept rows) ([1], f32). Liger's tvd.";
  static void check(const TensorView& loss, const TensorView& p, const TensorView& q,
                    const TensorView& labels, std::string_view reduction, int64_t ignore_index);
};

struct TvdBackward {
  static constexpr const char* name = "tvd_backward";
  using Signature = void(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                         const TensorView& q, const TensorView& labels,
                         std::string_view reduction, int64_t ignore_index);
  static constexpr ArgSpec args[] = {{"dp", ArgRole::out},
                                     {"dloss", ArgRole::in},
                                     {"p", ArgRole::in},
                                     {"q", ArgRole::in},
                                     {"labels", ArgRole::opt_in},
                                     {"reduction", ArgRole::scalar, "batchmean"},
                                     {"ignore_index", ArgRole::scalar, "-100"}};
  static constexpr const char* doc =
      "Backward of tvd with respect to p: dp = g * (0.5 if p > q else -0.5), g scaled as the "
      "reduction; ignored rows get 0 (Liger's sign convention: -0.5 where p == q).";
  static void check(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                    const TensorView& q, const TensorView& labels, std::string_view reduction,
                    int64_t ignore_index);
};

// Reference kernels (reference.cpp).
void cross_entropy_reference(const Context&, const TensorView& loss, const TensorView& lse,
                             const TensorView& logits, const TensorView& target,
                             int64_t ignore_index, double label_smoothing, double lse_square_scale,
                             double softcap, std::string_view reduction);
void cross_entropy_backward_reference(const Context&, const TensorView& dlogits,
                                      const TensorView& dloss, const TensorView& logits,
                                      const TensorView& target, const TensorView& lse,
                                      int64_t ignore_index, double label_smoothing,
                                      double lse_square_scale, double softcap,
                                      std::string_view reduction);
void cross_entropy_with_grad_reference(const Context&, const TensorView& loss,
                                       const TensorView& lse, const TensorView& dlogits,
                                       const TensorView& logits, const TensorView& target,
                                       const TensorView& dloss, int64_t ignore_index,
                                       double label_smoothing, double lse_square_scale,
                                       double softcap, std::string_view reduction);
void kl_div_reference(const Context&, const TensorView& loss, const TensorView& y_pred,
                      const TensorView& y_true, bool log_target, std::string_view reduction,
                      double eps);
void kl_div_backward_reference(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                               const TensorView& y_true, bool log_target,
                               std::string_view reduction, double eps);
void jsd_reference(const Context&, const TensorView& loss, const TensorView& input,
                   const TensorView& target, const TensorView& labels, double beta,
                   int64_t ignore_index);
void jsd_backward_reference(const Context&, const TensorView& dinput, const TensorView& dloss,
                            const TensorView& input, const TensorView& target,
                            const TensorView& labels, double beta, int64_t ignore_index);
void tvd_reference(const Context&, const TensorView& loss, const TensorView& p,
                   const TensorView& q, const TensorView& labels, std::string_view reduction,
                   int64_t ignore_index);
void tvd_backward_reference(const Context&, const TensorView& dp, const TensorView& dloss,
                            const TensorView& p, const TensorView& q, const TensorView& labels,
                            std::string_view reduction, int64_t ignore_index);

void register_loss(Registry& reg);  // loss.cpp

}  // namespace opforge
