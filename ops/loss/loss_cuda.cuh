// Helpers shared by the loss family's CUDA kernels (ops/loss/cuda.cu, ops/loss/cuda_divergence.cu,
// ops/linear/flce_cuda.cu): scalar loads of any floating dtype, the strides a launch passes, and
// the fixed-order reduction of per-row losses into a reduced loss (Note [loss row reduction]).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_launch.cuh"

namespace opforge::cuda::loss {

// One element of a floating tensor of any dtype (dloss, lse) as f32.
__device__ __forceinline__ float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f64: return float(static_cast<const double*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline bool float_like(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64; }

// Stride of dim 0 of a 1-d tensor, 0 when it has at most one element (any stride is legal then).
inline int64_t stride0(const TensorView& t) { return t.size(0) > 1 ? t.stride(0) : 0; }
// Row stride of a Note [row layout] tensor, 0 when it has at most one row.
inline int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

// Note [loss row reduction]: one block of 1024 threads turns `rows` per-row losses (f32, dense;
// `losses_per_row` consecutive partial sums per row) into one value. Each thread adds a contiguous
// chunk of rows in f64 (a row's partials in order), then a fixed tree over the block adds the
// partial sums (and the counts of kept rows): the same bits for the same inputs,
// no atomics, no host synchronization. A row is kept when `labels` is null or labels[row] !=
// ignore_index; rows that are not kept must have loss 0 (the kernels write 0 for them).
//   out = count of kept rows                  (count_only; `losses` may be null)
//   out = sum / (kept rows * divisor_scale)   (divide; 0 kept rows gives NaN, as 0 / 0, or 0
//                                              with zero_if_none_kept)
//   out = sum                                 (otherwise)
struct RowReduce {
  const float* losses = nullptr;
  int64_t losses_per_row = 1;
  int64_t rows = 0;
  const int64_t* labels = nullptr;
  int64_t labels_stride = 0;
  int64_t ignore_index = -100;
  bool divide = false;
  double divisor_scale = 1.0;
  bool zero_if_none_kept = false;
  bool count_only = false;
  float* out = nullptr;
};
// Enqueues the reduction on `stream` (defined in ops/loss/cuda.cu); `what` names the launch in
// errors.
void launch_row_reduce(cudaStream_t stream, const RowReduce& r, const char* what);

}  // namespace opforge::cuda::loss
