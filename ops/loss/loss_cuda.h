// CUDA kernels of cross_entropy and its backward (ops/loss/cuda.cu), declared for registration
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

// Registers the kernels above (called from src/registry/register_all.cpp in CUDA builds).
void register_loss_cuda(Registry& reg);

}  // namespace opforge
