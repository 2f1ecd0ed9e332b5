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

// The launch shape of a streaming element kernel of the family (cross_entropy_backward, the
// divergences' element-wise kernel; Note [backward units] in ops/loss/cuda.cu): 256-thread 2-D
// blocks, x over a row's units with `per_thread` units a thread (block x the least power of two
// that covers the row, at most 256), y over rows, grid y capped at 65,535 (the kernels stride
// over the rows beyond).
struct ElementLaunch {
  dim3 grid, block;
};
inline ElementLaunch element_launch(int64_t units, int64_t rows, int per_thread) {
  int bx = 1;
  while (int64_t(bx) * per_thread < units && bx < 256) bx *= 2;
  const int by = 256 / bx;
  const int64_t per_block = int64_t(bx) * per_thread;
  const int64_t grid_y = (rows + by - 1) / by < 65535 ? (rows + by - 1) / by : 65535;
  return {dim3(unsigned((units + per_block - 1) / per_block), unsigned(grid_y)), dim3(unsigned(bx), unsigned(by))};
}

// Note [loss row reduction]: one block of 1024 threads turns `rows` per-row losses (f32, dense;
// `losses_per_row` consecutive partial sums per row) into one value. The rows x losses_per_row
// partials are one flat array: thread t adds entries t, t + kThreads, ... in f64 (eight loads
// issued before they are added, so a thread waits out one L2 round trip per eight entries, not one
// per entry: 16 rows of 250 segment sums each are 16 loads a thread, where a thread per row had 250
// dependent ones), the kept rows are counted the same way over the labels, then fixed trees add
// the partial sums and counts (a shuffle butterfly in each warp, then one over the warps'
// results): the same bits for the same inputs and block size, no atomics, no host
// synchronization. A row is kept when `labels` is null or labels[row] != ignore_index; rows that
// are not kept must have loss 0 (the kernels write 0 for them).
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
// known_kept >= 0: the caller has counted the kept rows already (its block's threads loaded the
// labels before the losses were written), so the labels are not read again here.
template <int kThreads> __device__ void reduce_rows_in_block(const RowReduce& r, float known_kept = -1.0f) {
  double s = 0, c = 0;
  if (known_kept >= 0.0f) {
    c = threadIdx.x == 0 ? double(known_kept) : 0.0;
  } else if (r.labels == nullptr) {
    c = threadIdx.x == 0 ? double(r.rows) : 0.0;
  } else {
    for (int64_t i = threadIdx.x; i < r.rows; i += kThreads) c += r.labels[i * r.labels_stride] != r.ignore_index ? 1.0 : 0.0;
  }
  if (!r.count_only) {
    constexpr int kBatch = 8;
    const int64_t total = r.rows * r.losses_per_row;
    int64_t i = threadIdx.x;
    for (; i < total; i += kBatch * int64_t(kThreads)) {  // the last batch guarded, still issued together
      float v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) v[k] = i + k * int64_t(kThreads) < total ? __ldcg(r.losses + i + k * int64_t(kThreads)) : 0.0f;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) s += double(v[k]);
    }
  }
  // A butterfly in each warp, the warps' results through shared memory, a butterfly in warp 0:
  // two block barriers where a shared-memory tree over the block takes log2(kThreads) + 1.
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  constexpr int kWarps = kThreads / 32;
  __shared__ double sums[kWarps];
  __shared__ double counts[kWarps];
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, lane_mask);
    c += __shfl_xor_sync(0xffffffffu, c, lane_mask);
  }
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) {
    sums[warp] = s;
    counts[warp] = c;
  }
  __syncthreads();
  if (warp != 0) return;
  s = lane < kWarps ? sums[lane] : 0.0;
  c = lane < kWarps ? counts[lane] : 0.0;
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, lane_mask);
    c += __shfl_xor_sync(0xffffffffu, c, lane_mask);
  }
  if (lane != 0) return;
  if (r.count_only) *r.out = float(c);
  else if (!r.divide) *r.out = float(s);
  else if (c == 0.0 && r.zero_if_none_kept) *r.out = 0.0f;
  else *r.out = float(s / (c * r.divisor_scale));
}

// Enqueues the reduction on ctx's stream, launched programmatically (Note [programmatic launch];
// defined in ops/loss/cuda.cu); `what` names the launch in
// errors.
void launch_row_reduce(const Context& ctx, const RowReduce& r, const char* what);

// The arguments of cross_entropy_with_grad's kernels (ops/loss/ce_grad_kernels.cuh,
// ops/loss/cuda_ce_grad_few.cu). TOut: the gradient's dtype, T's except for f32 logits of a
// 16-bit model (fused_linear_cross_entropy_with_grad's token blocks, ce_grad_rows in cuda_fused.cu).
template <class T, class TOut = T> struct FusedArgs {
  const T* logits;
  int64_t logits_stride;
  TOut* dlogits;
  int64_t dlogits_stride;
  int64_t rows, vocab;
  const int64_t* target;
  int64_t target_stride;
  const void* dloss;
  DType dloss_dtype;
  int64_t dloss_stride;  // 0 for sum / mean (one element)
  const float* kept;     // mean: the count of kept rows (workspace); else null
  float* loss;           // [rows] (none) or the workspace (sum / mean)
  int64_t loss_stride;
  float* lse;
  int64_t lse_stride;
  int64_t ignore_index;
  float smoothing, z_scale, softcap;
  // Note [ce with grad, few rows]: mean's kept rows counted by every CTA (kept null), and sum /
  // mean's row losses added by the last row to arrive on `arrivals` (reduce.out non-null).
  bool count_in_block = false;
  unsigned* arrivals = nullptr;
  RowReduce reduce{};
};

}  // namespace opforge::cuda::loss
