// Loss family internals shared by loss.cpp, reference.cpp, cpu.cpp and cases.cpp (not public).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ops/loss/loss.h"

namespace opforge {

enum class Reduction : uint8_t { none, sum, mean, batchmean };

// The reduction named `s` (the op's check has accepted the name).
inline Reduction reduction_of(std::string_view s) {
  if (s == "none") return Reduction::none;
  if (s == "sum") return Reduction::sum;
  if (s == "batchmean") return Reduction::batchmean;
  return Reduction::mean;
}

// Whether row `row` counts: labels absent, or labels[row] != ignore_index.
inline bool row_kept(const TensorView& labels, int64_t row, int64_t ignore_index) {
  return !labels.defined() || labels.ptr<const int64_t>()[row * labels.stride(0)] != ignore_index;
}

// Rows of an [N] id tensor other than ignore_index (N when `labels` is absent).
inline int64_t kept_rows(const TensorView& labels, int64_t rows, int64_t ignore_index) {
  int64_t n = 0;
  for (int64_t row = 0; row < rows; ++row) n += row_kept(labels, row, ignore_index);
  return n;
}

// Note [loss outputs]: the dtype of per-token and reduced losses.
inline DType loss_dtype(DType input) { return input == DType::f64 ? DType::f64 : DType::f32; }

// The divisor of a reduced loss: 1 (sum), kept rows (batchmean), kept rows x V (mean).
inline double reduction_divisor(Reduction r, int64_t kept, int64_t vocab) {
  switch (r) {
    case Reduction::batchmean: return double(kept);
    case Reduction::mean: return double(kept) * double(vocab);
    default: return 1.0;
  }
}

// cpu.cpp: Highway + OpenMP kernels (same signatures as the reference kernels).
void cross_entropy_cpu(const Context&, const TensorView& loss, const TensorView& lse,
                       const TensorView& logits, const TensorView& target, int64_t ignore_index,
                       double label_smoothing, double lse_square_scale, double softcap,
                       std::string_view reduction);
void cross_entropy_backward_cpu(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                const TensorView& logits, const TensorView& target,
                                const TensorView& lse, int64_t ignore_index,
                                double label_smoothing, double lse_square_scale, double softcap,
                                std::string_view reduction);
void cross_entropy_with_grad_cpu(const Context&, const TensorView& loss, const TensorView& lse,
                                 const TensorView& dlogits, const TensorView& logits,
                                 const TensorView& target, const TensorView& dloss,
                                 int64_t ignore_index, double label_smoothing,
                                 double lse_square_scale, double softcap,
                                 std::string_view reduction);
void kl_div_cpu(const Context&, const TensorView& loss, const TensorView& y_pred,
                const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
void kl_div_backward_cpu(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                         const TensorView& y_true, bool log_target, std::string_view reduction,
                         double eps);
void jsd_cpu(const Context&, const TensorView& loss, const TensorView& input,
             const TensorView& target, const TensorView& labels, double beta,
             int64_t ignore_index);
void jsd_backward_cpu(const Context&, const TensorView& dinput, const TensorView& dloss,
                      const TensorView& input, const TensorView& target, const TensorView& labels,
                      double beta, int64_t ignore_index);
void tvd_cpu(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
             const TensorView& labels, std::string_view reduction, int64_t ignore_index);
void tvd_backward_cpu(const Context&, const TensorView& dp, const TensorView& dloss,
                      const TensorView& p, const TensorView& q, const TensorView& labels,
                      std::string_view reduction, int64_t ignore_index);
// Whether the cpu kernels take tensors of x's dtype and device: nullptr or the reason.
const char* loss_cpu_reason(const TensorView& x);

// cases.cpp
std::vector<Case> cross_entropy_cases();
std::vector<Case> cross_entropy_backward_cases();
std::vector<Case> cross_entropy_with_grad_cases();
std::vector<Case> kl_div_cases();
std::vector<Case> kl_div_backward_cases();
std::vector<Case> jsd_cases();
std::vector<Case> jsd_backward_cases();
std::vector<Case> tvd_cases();
std::vector<Case> tvd_backward_cases();

// ---- what cpu.cpp's per-target code receives (plain data; strides in elements) ----------------
// Which cross_entropy sweep a row gets: statistics (loss, lse), the gradient from a saved lse, or
// both, the gradient while the row is still in cache (cross_entropy_with_grad).
enum class CeSweep : uint8_t { forward, backward, fused };

struct CrossEntropyRows {
  DType dtype = DType::f32;
  int64_t vocab = 0;
  int64_t block = 0;  // Note [online softmax blocks]
  const void* logits = nullptr;
  int64_t logits_stride = 0;
  const int64_t* target = nullptr;
  int64_t target_stride = 0;
  int64_t ignore_index = -100;
  float label_smoothing = 0, lse_square_scale = 0, softcap = 0;
  // forward
  double* row_loss = nullptr;  // [N]
  float* row_lse = nullptr;    // [N]
  // backward (fused: grad and dlogits; the lse is the row's own)
  const float* lse = nullptr;  // [N] (widened by the caller when lse is f64)
  const double* grad = nullptr;  // [N]: the upstream gradient of each row (scale folded in)
  void* dlogits = nullptr;
  int64_t dlogits_stride = 0;
  bool stream = false;  // dlogits by streaming stores (Note [streaming stores])
};

enum class PairLoss : uint8_t { kl_div, kl_div_log_target, jsd, tvd };

// kl_div / jsd / tvd rows: element loss of (a, b) = (y_pred, y_true), (input, target) or (p, q).
struct PairRows {
  PairLoss kind = PairLoss::kl_div;
  DType dtype = DType::f32;
  int64_t vocab = 0;
  int64_t block = 0;
  float eps = 0, beta = 0;
  const void* a = nullptr;
  int64_t a_stride = 0;
  const void* b = nullptr;
  int64_t b_stride = 0;
  const uint8_t* kept = nullptr;  // [N] 1 / 0 per row
  // forward: element losses (none) into `out`, else row sums into row_sum
  double* row_sum = nullptr;
  // backward: out = grad * d(element loss)/da, grad per row or element-wise from `dloss`
  const double* grad = nullptr;  // [N] when dloss is not element-wise
  const void* dloss = nullptr;   // element-wise upstream gradient (input dtype)
  int64_t dloss_stride = 0;
  bool backward = false;
  void* out = nullptr;
  int64_t out_stride = 0;
};

}  // namespace opforge
