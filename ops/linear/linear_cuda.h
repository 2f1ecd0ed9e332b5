// CUDA kernels of the linear family (ops/linear/cuda.cu), declared for registration and for tests
// that call them directly:
//   linear_cuda_cublaslt  cuBLASLt GEMM, bias in the epilogue, f32 accumulation; predicate: dtype
//                         and a 16-byte aligned bias
//   linear_cuda           any layout the op's check accepts: a shared-memory tiled GEMM, f32 sums
//   fused_linear_cross_entropy(_backward)_cuda   below
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/linear/linear.h"

namespace opforge {

void linear_cuda_cublaslt(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b);
const char* linear_cuda_cublaslt_applicable(const TensorView& y, const TensorView& x,
                                            const TensorView& w, const TensorView& b);
void linear_cuda(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                 const TensorView& b);
const char* linear_cuda_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                   const TensorView& b);

// fused_linear_cross_entropy and its backward (ops/linear/flce_cuda.cu): blocks of logits through
// cuBLASLt and small row / column kernels; predicate: dtype (f32 / f16 / bf16) only.
void fused_linear_cross_entropy_cuda(const Context&, const TensorView& loss, const TensorView& lse,
                                     const TensorView& hidden, const TensorView& w, const TensorView& target,
                                     const TensorView& b, int64_t ignore_index, double label_smoothing,
                                     std::string_view reduction);
const char* fused_linear_cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& lse,
                                                       const TensorView& hidden, const TensorView& w,
                                                       const TensorView& target, const TensorView& b,
                                                       int64_t ignore_index, double label_smoothing,
                                                       std::string_view reduction);
void fused_linear_cross_entropy_backward_cuda(const Context&, const TensorView& dhidden, const TensorView& dw,
                                              const TensorView& db, const TensorView& dloss,
                                              const TensorView& hidden, const TensorView& w,
                                              const TensorView& target, const TensorView& lse, const TensorView& b,
                                              int64_t ignore_index, double label_smoothing,
                                              std::string_view reduction);
const char* fused_linear_cross_entropy_backward_cuda_applicable(
    const TensorView& dhidden, const TensorView& dw, const TensorView& db, const TensorView& dloss,
    const TensorView& hidden, const TensorView& w, const TensorView& target, const TensorView& lse,
    const TensorView& b, int64_t ignore_index, double label_smoothing, std::string_view reduction);
// fused_linear_cross_entropy_with_grad (flce_cuda.cu, Note [flce with grad]).
void fused_linear_cross_entropy_with_grad_cuda(const Context&, const TensorView& loss, const TensorView& lse,
                                               const TensorView& dhidden, const TensorView& dw, const TensorView& db,
                                               const TensorView& hidden, const TensorView& w,
                                               const TensorView& target, const TensorView& dloss,
                                               const TensorView& b, int64_t ignore_index, double label_smoothing,
                                               std::string_view reduction);
const char* fused_linear_cross_entropy_with_grad_cuda_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView& dhidden, const TensorView& dw,
    const TensorView& db, const TensorView& hidden, const TensorView& w, const TensorView& target,
    const TensorView& dloss, const TensorView& b, int64_t ignore_index, double label_smoothing,
    std::string_view reduction);
// Workspace bytes of the last fused_linear_cross_entropy(_backward)_cuda call on this thread
// (Note [flce cuda blocks]): the op's extra device memory.
int64_t flce_cuda_last_workspace_bytes();

// Note [flce cuda blocks]: the token rows and vocabulary columns of one block of logits and the
// workspace bytes of a call (reduced_forward: a forward with reduction sum or mean).
struct FlceCudaPlan {
  int64_t token_rows = 0;
  int64_t vocab_cols = 0;
  int64_t workspace_bytes = 0;
};
FlceCudaPlan flce_cuda_plan(int64_t tokens, int64_t hidden, int64_t vocab, DType dtype, bool backward,
                            bool reduced_forward);
// Note [flce with grad]: fused_linear_cross_entropy_with_grad's token blocks of whole rows
// (vocab_cols = V), or token_rows 0 when the call runs the forward and the backward instead.
FlceCudaPlan flce_cuda_with_grad_plan(int64_t tokens, int64_t hidden, int64_t vocab, DType dtype, bool reduced);

// register_linear_cuda registers linear's kernels and calls register_flce_cuda.
void register_linear_cuda(Registry& reg);
void register_flce_cuda(Registry& reg);

}  // namespace opforge
