// The GEMMs of fused_linear_cross_entropy's CUDA kernels (ops/linear/flce_cuda.cu, their only
// user): cuBLASLt through the linear op's handle and algorithm cache, and the tiled fallback GEMM
// that linear's `cuda` impl runs too (ops/linear/tiled_gemm.cuh) for shapes cuBLASLt has no
// algorithm for (or K = 0). Internal linkage: one copy per including file.
#pragma once

#include "backends/cuda/cuda_launch.cuh"
#include "ops/linear/cublaslt.cuh"
#include "ops/linear/tiled_gemm.cuh"

namespace opforge::cuda::flce {
namespace {

// ---- tiled fallback GEMM: D[m, n] = beta D + sum_k A(i, k) B(k, j) (ops/linear/tiled_gemm.cuh) ----
template <class T, class TD> void run_tiled(const Context& ctx, const lt::Gemm& g) {
  tiled::TiledArgs<T, TD> p{};
  p.a = static_cast<const T*>(g.a.data);
  p.a_row = g.a.trans ? 1 : g.a.ld, p.a_col = g.a.trans ? g.a.ld : 1;
  p.b = static_cast<const T*>(g.b.data);
  p.b_row = g.b.trans ? 1 : g.b.ld, p.b_col = g.b.trans ? g.b.ld : 1;
  p.bias = nullptr;
  p.d = static_cast<TD*>(g.d), p.ldd = g.ldd, p.m = g.m, p.n = g.n, p.k = g.k, p.beta = g.beta;
  tiled::launch_tiled(ctx, p, "fused_linear_cross_entropy tiled GEMM launch");
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
