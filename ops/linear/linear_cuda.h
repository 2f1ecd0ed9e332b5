// CUDA kernels of the linear family (ops/linear/cuda.cu), declared for registration and for tests
// that call them directly:
//   linear_cuda_cublaslt  cuBLASLt GEMM, bias in the epilogue, f32 accumulation; predicate: dtype
//                         and a 16-byte aligned bias
//   linear_cuda           any layout the op's check accepts: a shared-memory tiled GEMM, f32 sums
#pragma once

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

void register_linear_cuda(Registry& reg);

}  // namespace opforge
