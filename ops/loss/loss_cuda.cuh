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
// The reduction of Note [loss row reduction] run by one block of kThreads threads (a power of two,
// blockDim.x == kThreads): by reduce_kernel (ops/loss/cuda.cu) and by the last block of a kernel
// that wrote the losses in the same launch (Note [last block]; the losses are read with __ldcg).
template <int kThreads> __device__ void reduce_rows_in_block(const RowReduce& r) {
  __shared__ double sums[kThreads];
  __shared__ double counts[kThreads];
  const int64_t chunk = (r.rows + kThreads - 1) / kThreads;
  const int64_t begin = int64_t(threadIdx.x) * chunk, end = min(r.rows, begin + chunk);
  double s = 0, c = 0;
  for (int64_t i = begin; i < end; ++i) {
    const bool kept = r.labels == nullptr || r.labels[i * r.labels_stride] != r.ignore_index;
    c += kept ? 1.0 : 0.0;
    if (!r.count_only)
      for (int64_t j = 0; j < r.losses_per_row; ++j) s += double(__ldcg(r.losses + i * r.losses_per_row + j));
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (r.count_only) *r.out = float(counts[0]);
  else if (!r.divide) *r.out = float(sums[0]);
  else if (counts[0] == 0.0 && r.zero_if_none_kept) *r.out = 0.0f;
  else *r.out = float(sums[0] / (counts[0] * r.divisor_scale));
}

// Enqueues the reduction on `stream` (defined in ops/loss/cuda.cu); `what` names the launch in
// errors.
void launch_row_reduce(cudaStream_t stream, const RowReduce& r, const char* what);

}  // namespace opforge::cuda::loss
