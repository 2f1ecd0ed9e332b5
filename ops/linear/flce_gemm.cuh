// The GEMMs of fused_linear_cross_entropy's CUDA kernels (ops/linear/flce_cuda.cu, their only
// user): cuBLASLt through the linear op's handle and algorithm cache, and a tiled fallback for
// shapes cuBLASLt has no algorithm for (or K = 0). Internal linkage: one copy per including file.
#pragma once

#include "backends/cuda/cuda_launch.cuh"
#include "ops/linear/cublaslt.cuh"

namespace opforge::cuda::flce {
namespace {

// ---- tiled fallback GEMM: D[m, n] = beta D + sum_k A(i, k) B(k, j), any element strides ----------
constexpr int kTile = 64, kStepK = 16;

template <class T, class TD> struct TiledArgs {
  const T* a;
  int64_t a_row, a_col;  // A(i, k) = a[i * a_row + k * a_col]
  const T* b;
  int64_t b_row, b_col;  // B(k, j) = b[k * b_row + j * b_col]
  TD* d;
  int64_t ldd, m, n, k;
  float beta;
};

template <class T, class TD> __global__ void __launch_bounds__(256) tiled_kernel(TiledArgs<T, TD> p) {
  __shared__ float as[kStepK][kTile + 1];  // as[kk][row]
  __shared__ float bs[kStepK][kTile + 1];  // bs[kk][col]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < p.m; row0 += int64_t(gridDim.y) * kTile) {
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.k; k0 += kStepK) {
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
        *out = from_f32<TD>(acc[i][j] + prior);
      }
    }
  }
}

template <class T, class TD> void run_tiled(const Context& ctx, const lt::Gemm& g) {
  TiledArgs<T, TD> p{};
  p.a = static_cast<const T*>(g.a.data);
  p.a_row = g.a.trans ? 1 : g.a.ld, p.a_col = g.a.trans ? g.a.ld : 1;
  p.b = static_cast<const T*>(g.b.data);
  p.b_row = g.b.trans ? 1 : g.b.ld, p.b_col = g.b.trans ? g.b.ld : 1;
  p.d = static_cast<TD*>(g.d), p.ldd = g.ldd, p.m = g.m, p.n = g.n, p.k = g.k, p.beta = g.beta;
  const dim3 grid(grid_for(g.n, kTile), unsigned(std::min<int64_t>((g.m + kTile - 1) / kTile, 65535)));
  tiled_kernel<T, TD><<<grid, 256, 0, stream_of(ctx)>>>(p);
  check_launch("fused_linear_cross_entropy tiled GEMM launch");
}

// D = op(A) op(B) + beta D through cuBLASLt, or the tiled kernel when it has no algorithm.
void gemm(const Context& ctx, const lt::Gemm& g, void* lt_workspace) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0 && g.beta == 1.0f) return;  // D unchanged
  if (g.k > 0 && lt::matmul(ctx, g, lt_workspace)) return;
  dispatch_float(g.a.dtype, "fused_linear_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    if (g.d_dtype == DType::f32) run_tiled<T, float>(ctx, g);
    else run_tiled<T, T>(ctx, g);
  });
}

}  // namespace
}  // namespace opforge::cuda::flce
