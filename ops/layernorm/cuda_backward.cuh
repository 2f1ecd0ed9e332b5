// Parts of layer_norm_backward's CUDA kernels shared by ops/layernorm/cuda_fast.cu (the cp.async
// ring, the dispatch), ops/layernorm/cuda_backward_bulk.cu (the many-row bulk-copy pipeline) and
// ops/layernorm/cuda_backward_cluster.cu (the few-row cluster).
#pragma once

#include "ops/layernorm/layernorm_cuda.h"
#include "ops/norm/cuda_backward.cuh"

namespace opforge::cuda {

// 1 / sqrt(var + eps) of a row from its centred sum of squares: layer_norm's every CUDA kernel
// (Note [row rsqrt]).
template <class T> __device__ __forceinline__ float rstd_of(float centred_sum_sq, int64_t hidden, float eps) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / sqrtf(centred_sum_sq / float(hidden) + eps);
  else return row_rsqrt(fmaf(centred_sum_sq, 1.0f / float(hidden), eps));  // 1 / hidden: hoisted
}

// Note [backward centring]: the layer_norm backward kernels reduce each row about a point c near
// its mean (the f32 mean of a first reduction, or the row's first element): the sums of d = x - c,
// d^2, g and g d (g = dy * w) give shift = sum d / n = mean - c, the centred sum of squares
// M2 = sum d^2 - sum d * shift and sum g (x - mean) = sum g d - shift * sum g, and the kernels take
// xhat = ((x - c) - shift) * rstd. x - c is exact in f32 while x and c are within a factor of two
// of each other, so xhat keeps its low bits in a row far from zero, where x - mean with the mean
// rounded to f32 would carry that rounding into every element of the row and, summed over the
// rows, into dw (mean 100, 2,400 rows of 1,000: 5e-4 off the f64 reference).
// The four sums of a row, one element at a time: d, d^2, g, g d (d = x - c, g = dy * w).
__device__ __forceinline__ void add_row_sums(float (&s)[4], float d, float g) {
  s[0] += d;
  s[1] += d * d;
  s[2] += g;
  s[3] += g * d;
}
struct CentredRow {
  float shift, m2, gd;  // mean - c, M2 (clamped at 0), sum g (x - mean)
};
__device__ __forceinline__ CentredRow centred_row(const float (&s)[4], float inv_h) {
  const float shift = s[0] * inv_h;
  return {shift, fmaxf(s[1] - s[0] * shift, 0.0f), s[3] - shift * s[2]};
}

}  // namespace opforge::cuda

namespace opforge::cuda::layernorm_fast {

template <class T> struct BwdArgs {
  T* dx;
  const T* dy;
  const T* x;
  const T* w;
  int64_t dx_stride, dy_stride, x_stride;  // row strides in elements
  int64_t rows, hidden;
  float eps;
};

// Note [layer_norm backward in one reduction] (cuda_backward_bulk.cu): the many-row kernel; false
// when it does not take the call (too few rows, a row longer than 2 * 512 packs or stages that do
// not fit): the caller runs the ring kernel. Instantiated for float, half and bfloat16.
template <class T>
bool launch_bwd_rows(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, const TensorView& db);

// Note [few-row layer_norm backward cluster] (cuda_backward_cluster.cu): the few-row kernel, one
// thread-block cluster; false when it does not take the call (more than two rows a thread, a row
// too long, no cluster launch on this device, or OPFORGE_CUDA_CLUSTER_ROWS=0).
template <class T>
bool launch_bwd_cluster(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, const TensorView& db);

}  // namespace opforge::cuda::layernorm_fast
