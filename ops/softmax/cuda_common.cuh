// Definitions shared by the softmax family's CUDA kernels (ops/softmax/cuda.cu,
// ops/softmax/cuda_pipeline.cu): the four kinds, their launch arguments and their math per element.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge::cuda::softmax {

enum class Kind { softmax, log_softmax, softmax_backward, log_softmax_backward };
constexpr bool is_backward(Kind k) { return k == Kind::softmax_backward || k == Kind::log_softmax_backward; }

// The ops' math per element (cuda.cu's header formulas), one definition for every kernel: the
// backward's row-sum term, the forward's output from the row's (max, 1 / sum, log sum), and the
// backward's output from the row's sum.
template <Kind kKind> __device__ __forceinline__ float row_term(float g, float y) {
  return kKind == Kind::softmax_backward ? g * y : g;
}
// m2 = m log2(e) (exp_shifted).
template <class T, Kind kKind>
__device__ __forceinline__ float forward_out(float x, float m, float m2, float inv_s, float log_s) {
  return kKind == Kind::softmax ? rows::exp_shifted<T>(x, m, m2) * inv_s : x - m - log_s;
}
template <class T, Kind kKind> __device__ __forceinline__ float backward_out(float g, float y, float total) {
  return kKind == Kind::softmax_backward ? y * (g - total) : g - rows::exp_of<T>(y) * total;
}

template <class T> struct Args {
  T* out;        // y (forward) or dx (backward)
  const T* a;    // x (forward) or dy (backward)
  const T* b;    // y (backward only)
  int64_t out_stride, a_stride, b_stride;
  int64_t rows, n;
};

// Note [softmax row pipeline] (cuda_pipeline.cu): the forward kinds at many long rows of 16-byte
// packs (`units` packs a row); false when it does not take the call (the caller then runs the
// many-row cluster or the row kernel).
template <class T, Kind kKind>
bool launch_row_pipeline(const Context& ctx, const Args<T>& p, int64_t units, const CudaDeviceProps& props);

}  // namespace opforge::cuda::softmax
