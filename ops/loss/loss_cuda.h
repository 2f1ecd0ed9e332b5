// CUDA kernels of the loss family (cross_entropy: ops/loss/cuda.cu; kl_div, jsd, tvd:
// ops/loss/cuda_divergence.cu), declared for registration
// and for tests that call them directly. Two kernels per op:
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtypes only
//   <op>_cuda_vec16  16-byte packs; predicate: alignment, V and row strides multiples of the pack
#pragma once

#include <string_view>

#include "ops/loss/loss.h"

namespace opforge {

void cross_entropy_cuda(const Context&, const TensorView& loss, const TensorView& lse, const TensorView& logits,
                        const TensorView& target, int64_t ignore_index, double label_smoothing,
                        double lse_square_scale, double softcap, std::string_view reduction);
void cross_entropy_cuda_vec16(const Context&, const TensorView& loss, const TensorView& lse,
                              const TensorView& logits, const TensorView& target, int64_t ignore_index,
                              double label_smoothing, double lse_square_scale, double softcap,
                              std::string_view reduction);
const char* cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                                          const TensorView& target, int64_t ignore_index, double label_smoothing,
                                          double lse_square_scale, double softcap, std::string_view reduction);
const char* cross_entropy_cuda_vec16_applicable(const TensorView& loss, const TensorView& lse,
                                                const TensorView& logits, const TensorView& target,
                                                int64_t ignore_index, double label_smoothing,
                                                double lse_square_scale, double softcap,
                                                std::string_view reduction);

void cross_entropy_backward_cuda(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                 const TensorView& logits, const TensorView& target, const TensorView& lse,
                                 int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                 double softcap, std::string_view reduction);
void cross_entropy_backward_cuda_vec16(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                       const TensorView& logits, const TensorView& target, const TensorView& lse,
                                       int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                       double softcap, std::string_view reduction);
const char* cross_entropy_backward_cuda_applicable(const TensorView& dlogits, const TensorView& dloss,
                                                   const TensorView& logits, const TensorView& target,
                                                   const TensorView& lse, int64_t ignore_index,
                                                   double label_smoothing, double lse_square_scale,
                                                   double softcap, std::string_view reduction);
const char* cross_entropy_backward_cuda_vec16_applicable(const TensorView& dlogits, const TensorView& dloss,
                                                         const TensorView& logits, const TensorView& target,
                                                         const TensorView& lse, int64_t ignore_index,
                                                         double label_smoothing, double lse_square_scale,
                                                         double softcap, std::string_view reduction);

// kl_div, jsd, tvd and their backward ops (ops/loss/cuda_divergence.cu), same two kernels per op.
void kl_div_cuda(const Context&, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                 bool log_target, std::string_view reduction, double eps);
void kl_div_cuda_vec16(const Context&, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                       bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                                   bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_vec16_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                                         bool log_target, std::string_view reduction, double eps);

void kl_div_backward_cuda(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                          const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
void kl_div_backward_cuda_vec16(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                                const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
const char* kl_div_backward_cuda_applicable(const TensorView& dy_pred, const TensorView& dloss,
                                            const TensorView& y_true, bool log_target, std::string_view reduction,
                                            double eps);
const char* kl_div_backward_cuda_vec16_applicable(const TensorView& dy_pred, const TensorView& dloss,
                                                  const TensorView& y_true, bool log_target,
                                                  std::string_view reduction, double eps);

void jsd_cuda(const Context&, const TensorView& loss, const TensorView& input, const TensorView& target,
              const TensorView& labels, double beta, int64_t ignore_index);
void jsd_cuda_vec16(const Context&, const TensorView& loss, const TensorView& input, const TensorView& target,
                    const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_vec16_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                      const TensorView& labels, double beta, int64_t ignore_index);

// cuda_vec16_fast (cuda_divergence.cu, Note [unrolled pair rows]): reduced forward only.
void kl_div_cuda_vec16_fast(const Context&, const TensorView& loss, const TensorView& y_pred,
                            const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& y_pred,
                                              const TensorView& y_true, bool log_target,
                                              std::string_view reduction, double eps);
void jsd_cuda_vec16_fast(const Context&, const TensorView& loss, const TensorView& input,
                         const TensorView& target, const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& input,
                                           const TensorView& target, const TensorView& labels, double beta,
                                           int64_t ignore_index);
void jsd_backward_cuda(const Context&, const TensorView& dinput, const TensorView& dloss, const TensorView& input,
                       const TensorView& target, const TensorView& labels, double beta, int64_t ignore_index);
void jsd_backward_cuda_vec16(const Context&, const TensorView& dinput, const TensorView& dloss,
                             const TensorView& input, const TensorView& target, const TensorView& labels,
                             double beta, int64_t ignore_index);
const char* jsd_backward_cuda_applicable(const TensorView& dinput, const TensorView& dloss, const TensorView& input,
                                         const TensorView& target, const TensorView& labels, double beta,
                                         int64_t ignore_index);
const char* jsd_backward_cuda_vec16_applicable(const TensorView& dinput, const TensorView& dloss,
                                               const TensorView& input, const TensorView& target,
                                               const TensorView& labels, double beta, int64_t ignore_index);

void tvd_cuda(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
              const TensorView& labels, std::string_view reduction, int64_t ignore_index);
void tvd_cuda_vec16(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
                    const TensorView& labels, std::string_view reduction, int64_t ignore_index);
const char* tvd_cuda_applicable(const TensorView& loss, const TensorView& p, const TensorView& q,
                                const TensorView& labels, std::string_view reduction, int64_t ignore_index);
const char* tvd_cuda_vec16_applicable(const TensorView& loss, const TensorView& p, const TensorView& q,
                                      const TensorView& labels, std::string_view reduction, int64_t ignore_index);

void tvd_backward_cuda(const Context&, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                       const TensorView& q, const TensorView& labels, std::string_view reduction,
                       int64_t ignore_index);
void tvd_backward_cuda_vec16(const Context&, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                             const TensorView& q, const TensorView& labels, std::string_view reduction,
                             int64_t ignore_index);
const char* tvd_backward_cuda_applicable(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                                         const TensorView& q, const TensorView& labels, std::string_view reduction,
                                         int64_t ignore_index);
const char* tvd_backward_cuda_vec16_applicable(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                                               const TensorView& q, const TensorView& labels,
                                               std::string_view reduction, int64_t ignore_index);

// Registers the kernels above (called from src/registry/register_all.cpp in CUDA builds);
// register_loss_cuda calls register_divergence_cuda (ops/loss/cuda_divergence.cu).
void register_loss_cuda(Registry& reg);
void register_divergence_cuda(Registry& reg);

}  // namespace opforge
