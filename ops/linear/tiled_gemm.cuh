// The tiled fallback GEMM of linear's `cuda` kernel (ops/linear/cuda.cu) and of
// fused_linear_cross_entropy's GEMMs where cuBLASLt has no algorithm (ops/linear/flce_gemm.cuh):
//   D[m, n] = sum_k A(i, k) B(k, j) (+ beta D) (+ bias[j]),
// A and B addressed through element strides (so either may be a transposed view), f32
// accumulation, one rounding to D's type. A 64 x 64 output tile per 256-thread block, each thread
// 4 x 4 outputs, K walked in steps of 16 through shared memory (both tiles loaded with scalar
// loads, converted to f32 on the way in). int64 offsets; the grid's y strides over M beyond 65,535
// tiles. A correctness path for any layout, not a fast one. Internal linkage: one copy per
// including file.
#pragma once

#include <algorithm>

#include "backends/cuda/cuda_launch.cuh"

namespace opforge::cuda::tiled {
namespace {

constexpr int kTile = 64, kStepK = 16;

template <class T, class TD> struct TiledArgs {
  const T* a;
  int64_t a_row, a_col;  // A(i, k) = a[i * a_row + k * a_col]
  const T* b;
  int64_t b_row, b_col;  // B(k, j) = b[k * b_row + j * b_col]
  const T* bias;         // [n], or null
  TD* d;
  int64_t ldd, m, n, k;
  float beta;  // 0: D is not read
};

template <class T, class TD> __global__ void __launch_bounds__(256) tiled_kernel(TiledArgs<T, TD> p) {
  __shared__ float as[kStepK][kTile + 1];  // as[kk][row]
  __shared__ float bs[kStepK][kTile + 1];  // bs[kk][col]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < p.m; row0 += int64_t(gridDim.y) * kTile) {
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.k; k0 += kStepK) {
      // 64 x 16 values of each operand: 1,024 per tile, 4 per thread.
      for (int e = threadIdx.x; e < kTile * kStepK; e += 256) {
        const int r = e / kStepK, kk = e % kStepK;
        const int64_t kg = k0 + kk, ar = row0 + r, bc = col0 + r;
        as[kk][r] = (ar < p.m && kg < p.k) ? to_f32(p.a[ar * p.a_row + kg * p.a_col]) : 0.0f;
        bs[kk][r] = (bc < p.n && kg < p.k) ? to_f32(p.b[kg * p.b_row + bc * p.b_col]) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kStepK; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i], bv[i] = bs[kk][tx + 16 * i];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + ty + 16 * i;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = col0 + tx + 16 * j;
        if (col >= p.n) continue;
        TD* out = p.d + row * p.ldd + col;
        const float prior = p.beta != 0.0f ? p.beta * to_f32(*out) : 0.0f;
        float v = acc[i][j] + prior;
        if (p.bias) v += to_f32(p.bias[col]);
        *out = from_f32<TD>(v);
      }
    }
  }
}

// Launches tiled_kernel for p on ctx's stream; `what` names the launch in an error.
template <class T, class TD> void launch_tiled(const Context& ctx, const TiledArgs<T, TD>& p, const char* what) {
  const dim3 grid(grid_for(p.n, kTile), unsigned(std::min<int64_t>((p.m + kTile - 1) / kTile, 65535)));
  tiled_kernel<T, TD><<<grid, 256, 0, stream_of(ctx)>>>(p);
  check_launch(what);
}

}  // namespace
}  // namespace opforge::cuda::tiled
