// Parts shared by the register-resident backward kernels of the norm family (cuda_backward.cu)
// and the bulk-copy pipeline (cuda_backward_bulk.cu): row scales, row pointers and the dw
// partials with their fixed-order reduction (Note [one-launch dw]).
#pragma once

#include <algorithm>

#include "ops/norm/cuda_common.cuh"

namespace opforge::cuda::norm {

// (r, r^3 / hidden * sum m*x) of a row from its (sum x^2, sum m*x).
template <class T>
__device__ __forceinline__ float2 row_scales(float2 sums, const BwdArgs<T>& a) {
  const float rstd = 1.0f / sqrtf(sums.x / float(a.hidden) + a.eps);
  return make_float2(rstd, rstd * rstd * rstd / float(a.hidden) * sums.y);  // (r, r^3/H * sum m*x)
}

// Row pointers of one row; columns inside a row fit an int (at most 2 * 512 packs here).
template <class T> struct BwdRow {
  const T* x;
  const T* r;
  const T* dy;
  const T* ds;
  T* dx;
  T* dr;
};
template <class T, bool kFused> __device__ __forceinline__ BwdRow<T> bwd_row(const BwdArgs<T>& a, int64_t row) {
  BwdRow<T> p{a.x + row * a.x_stride, nullptr, a.dy + row * a.dy_stride, nullptr,
              a.dx + row * a.dx_stride, nullptr};
  if constexpr (kFused) {
    p.r = a.r + row * a.r_stride;
    p.ds = a.ds + row * a.ds_stride;
    p.dr = a.dr + row * a.dr_stride;
  }
  return p;
}

// Phase 2 of Note [one-launch dw], after the grid barrier: the partials [parts, columns] are
// summed column by column, block b taking its slice of ceil(columns / gridDim.x) columns, `cw`
// columns at a time with `ny` threads per column each summing every ny-th partial in index order
// (__ldcg: written by other blocks), then one thread per column adds the ny results in order and
// hands the total to out(column, total), which rounds and stores it once. `slice` holds
// blockDim.x floats.
template <class Out>
__device__ __forceinline__ void reduce_partials(const float* partial, int64_t parts, int64_t columns,
                                                float* slice, Out out) {
  const int threads = blockDim.x;
  const int64_t per_block = (columns + gridDim.x - 1) / gridDim.x;
  const int64_t c_begin = int64_t(blockIdx.x) * per_block;
  const int64_t c_end = min(columns, c_begin + per_block);
  const int cw = int(per_block < threads ? per_block : int64_t(threads));  // columns at a time
  const int ny = threads / cw;                                            // threads per column
  const int cx = threadIdx.x % cw, py = threadIdx.x / cw;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += cw) {  // block-uniform; one pass when G >= H / threads
    const int64_t col = c0 + cx;
    if (py < ny) {
      float acc = 0.0f;
      if (col < c_end)
#pragma unroll 8
        for (int64_t q = py; q < parts; q += ny) acc += __ldcg(partial + q * columns + col);
      slice[py * cw + cx] = acc;
    }
    __syncthreads();
    if (threadIdx.x < cw && col < c_end) {
      float total = 0.0f;
      for (int y = 0; y < ny; ++y) total += slice[y * cw + threadIdx.x];
      out(col, total);
    }
    __syncthreads();
  }
}

// dw of the rms_norm backward kernels: every block of the grid wrote one partial row.
template <class T>
__device__ __forceinline__ void dw_from_partials(const float* partial, int64_t hidden, float* slice,
                                                 T* dw_out, int64_t dw_stride) {
  reduce_partials(partial, gridDim.x, hidden, slice,
                  [&](int64_t col, float total) { dw_out[col * dw_stride] = from_f32<T>(total); });
}

// The grid of a one-launch backward (Note [one-launch dw]): `resident` blocks at most, each a
// chunk of rows (a multiple of R), and at least hidden / threads blocks so that phase 2 gives each
// thread a handful of loads (some blocks without rows when rows are few).
struct OneLaunchGrid {
  int64_t blocks = 1, rows_per_block = 1;
};
inline OneLaunchGrid one_launch_grid(int64_t rows, int64_t hidden, int64_t resident, int block, int R = 1) {
  OneLaunchGrid g;
  const int64_t steps = (rows + R - 1) / R;
  g.rows_per_block = (steps + resident - 1) / resident * R;
  const int64_t min_blocks = std::min(resident, (hidden + block - 1) / block);
  g.blocks = std::max((rows + g.rows_per_block - 1) / g.rows_per_block, min_blocks);
  return g;
}

// A block's dw accumulators (K packs a thread) as row blockIdx.x of partials [G, hidden].
template <class T, int K>
__device__ __forceinline__ void store_dw_partial(float* partial, int64_t hidden, const float (&dw)[K][Pack<T>::n]) {
  constexpr int N = Pack<T>::n;
  float* dw_part = partial + int64_t(blockIdx.x) * hidden;
  const int n_packs = int(hidden / N);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n_packs)
#pragma unroll
      for (int j = 0; j < N; j += 4)
        *reinterpret_cast<float4*>(dw_part + i * N + j) =
            make_float4(dw[k][j], dw[k][j + 1], dw[k][j + 2], dw[k][j + 3]);
  }
}

// Note [bulk-copy row pipeline] (cuda_backward_bulk.cu): runs the many-row vec16 backward through
// shared memory filled by the copy engine; false when its stages do not fit (the caller then runs
// the register-resident kernel). Instantiated for float, half and bfloat16, fused or not.
template <class T, bool kFused>
bool launch_bwd_bulk(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw);

}  // namespace opforge::cuda::norm
