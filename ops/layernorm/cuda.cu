// CUDA kernels of layer_norm and layer_norm_backward.
//
// Math (the ops' docs): mean and the centred, biased variance of each row in f32,
// rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w + b (b may be none). Backward with
// xhat = (x - mean) * rstd and g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// dw = sum over rows of dy * xhat, db = sum over rows of dy. mean and rstd are recomputed from x;
// the backward kernels centre about the f32 mean of a first reduction (Note [backward centring]
// in cuda_backward.cuh).
//
// Technique.
//  - cuda_vec16 (priority 200): Note [register-resident row] (ops/norm/cuda_common.cuh). A row is
//    read as 16-byte packs (8 bf16/f16 or 4 f32 per LDG.128) that stay in registers, so x (and dy)
//    is read from memory once although the statistics need two reductions (the sum, then the
//    centred sum of squares, as the reference: no E[x^2] - E[x]^2 cancellation). Rows of <= 32
//    packs share 256-thread blocks (a group of 1..32 lanes per row, shuffle reductions); longer
//    rows take one block (warp, then block reduction, Note [cuda reductions]); with many rows a
//    block of <= 512 threads takes 2 rows at once (all their loads issued before the reductions,
//    Note [rows in flight] in ops/norm/cuda.cu). Forward: up to 2 * 1024 packs per row (hidden
//    16384 bf16, 8192 f32; the bf16 kernel with 2 packs a thread spills 20 bytes at 1024 threads);
//    backward: 2 * 512 packs. w and b are loaded once per thread and kept in registers. Needs 16-byte aligned pointers, hidden and row
//    strides multiples of the pack, w and b contiguous (the predicates say which fails).
//  - cuda (priority 100): any layout the check accepts. One block per row, scalar loads, three
//    passes over the row (the later passes hit L1/L2).
//  - dw and db (Note [deterministic dw] in ops/norm/cuda_backward.cu): a fixed number of blocks G
//    (from the SM count and the block size), block b owns a contiguous chunk of rows and sums its
//    dw and db in f32 (registers in vec16, its own workspace row in the scalar kernel), writing
//    one row of partials [G, 2 * hidden] to the per-stream workspace (Note [cuda workspace]). A
//    second launch sums each column's G partials in a fixed order and rounds once. No atomics:
//    the bits depend only on the inputs, the SM count and the block size.
//  f32 arithmetic, int64 row offsets (row * row_stride), launches on ctx.stream, no host
//  synchronization; the workspace is allocated only on the first call with a larger shape. Every
//  kernel here is launched programmatically (Note [programmatic launch] in cuda_launch.cuh).
//
// Aliasing: y may alias x exactly. Every element is read and then written by the same thread (the
// same pack slot in vec16, the same column in every pass of the scalar kernel), and a row's
// statistics are complete (a barrier or a shuffle) before its first store. The backward outputs
// overlap no input (its check).
#include <algorithm>
#include <initializer_list>

#include "ops/layernorm/cuda_backward.cuh"
#include "ops/layernorm/layernorm_cuda.h"
#include "ops/norm/cuda_common.cuh"

namespace opforge {
namespace cuda::layernorm {
namespace {

using norm::register_row_shape;
using norm::row_stride_of;
using norm::RowShape;

constexpr int kFwdMaxThreads = 1024;  // forward: up to 2 * 1024 packs per row
constexpr int kBwdMaxThreads = 512;   // backward: up to 2 * 512 packs (more live values)

template <class T> struct FwdArgs {
  T* y;
  const T* x;
  const T* w;
  const T* b;  // nullptr: no bias
  int64_t y_stride, x_stride, w_stride, b_stride;  // row strides; w, b: element strides
  int64_t rows, hidden;
  float eps;
};

template <class T> struct BwdArgs {
  T* dx;
  const T* dy;
  const T* x;
  const T* w;
  int64_t dx_stride, dy_stride, x_stride, w_stride;
  int64_t rows, hidden;
  float eps;
};

// Sum over the threads of one row: a lane group (threads <= 32) or the whole block.
// R sums at once (one barrier pair for all R when the row takes the whole block); `scratch` holds
// R * 32 floats.
template <int R> __device__ __forceinline__ void rows_sum(float (&v)[R], int threads, float* scratch) {
  if (threads > 32) {
    block_sum_n<R>(v, scratch);
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = lane_group_sum(v[r], threads);
  }
}

// ---- forward, scalar -------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(512) layer_norm_rows_kernel(FwdArgs<T> a) {
  __shared__ float scratch[32];
  __shared__ float scratch2[2 * 32];
  programmatic_prologue();  // Note [programmatic launch]
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {  // block-uniform
    const T* x = a.x + row * a.x_stride;
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) sum += to_f32(x[c]);
    const float mean0 = block_sum(sum, scratch) / float(a.hidden);
    // Centred sums about mean0 with the correction of the register kernels (a row far from zero
    // loses the low bits of its f32 sum; sum(d) recovers them): mean = mean0 + sum(d) / n.
    float cs[2] = {0.0f, 0.0f};  // sum d, sum d^2
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
      const float d = to_f32(x[c]) - mean0;
      cs[0] += d;
      cs[1] += d * d;
    }
    block_sum_n<2>(cs, scratch2);
    const float shift = cs[0] / float(a.hidden);
    const float mean = mean0 + shift;
    const float rstd = rstd_of<T>(fmaxf(cs[1] - cs[0] * shift, 0.0f), a.hidden, a.eps);
    T* y = a.y + row * a.y_stride;
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
      const float bias = a.b ? to_f32(a.b[c * a.b_stride]) : 0.0f;
      y[c] = from_f32<T>((to_f32(x[c]) - mean) * rstd * to_f32(a.w[c * a.w_stride]) + bias);
    }
  }
}

// ---- forward, register-resident --------------------------------------------------------------------
// `threads` threads per row; blockDim.x / threads row slots per block. Pack i of a row lives in
// thread i % threads of the row's group, slot i / threads. Each slot takes R rows at once
// (Note [rows in flight] in ops/norm/cuda.cu: every load of the R rows is issued before the first
// reduction), so a block step covers R * blockDim.x / threads rows. R > 1 only with blocks of at
// most 512 threads, two of them per SM (64 registers).
template <class T, int K, int R>
__global__ void __launch_bounds__(R == 1 ? kFwdMaxThreads : 512, R == 1 ? 1 : 2)
    layer_norm_vec_kernel(FwdArgs<T> a, int threads) {
  constexpr int N = Pack<T>::n;
  __shared__ float scratch[R * 32];
  const int n_packs = int(a.hidden / N);
  const int slots = blockDim.x / threads;
  const int t = threadIdx.x % threads;
  const bool has_b = a.b != nullptr;
  programmatic_prologue();  // Note [programmatic launch]
  Pack<T> wp[K], bp[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = t + k * threads;
    if (i < n_packs) {
      wp[k] = load_pack_readonly(a.w + i * N);
      if (has_b) bp[k] = load_pack_readonly(a.b + i * N);
    }
  }
  const int64_t rows_per_step = int64_t(slots) * R;
  const int64_t step = int64_t(gridDim.x) * rows_per_step;
  // The loop bound is block-uniform so that every lane reaches the shuffles and barriers.
  for (int64_t base = int64_t(blockIdx.x) * rows_per_step; base < a.rows; base += step) {
    Pack<T> xp[R][K];
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + int64_t(r) * slots + threadIdx.x / threads;
      const bool live = row < a.rows;
      const T* x = a.x + (live ? row : 0) * a.x_stride;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = t + k * threads;
        if (live && i < n_packs) xp[r][k] = load_pack(x + i * N);
      }
    }
    // Sums, then means.
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = base + int64_t(r) * slots + threadIdx.x / threads < a.rows;
      v[r] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (live && t + k * threads < n_packs) {
          const PackFloats<T> xf = widen_pack(xp[r][k]);
#pragma unroll
          for (int j = 0; j < N; ++j) v[r] += xf.v[j];
        }
    }
    rows_sum<R>(v, threads, scratch);
    float mean[R];
#pragma unroll
    for (int r = 0; r < R; ++r) mean[r] = v[r] / float(a.hidden);
    // Centred sums of d = x - mean and of d^2. A row far from zero (mean 100, spread 1) loses
    // the low bits of its f32 sum; sum(d) is that lost part, so mean + sum(d) / n is the
    // corrected mean and sum(d^2) - sum(d)^2 / n the corrected centred sum of squares.
    float c[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = base + int64_t(r) * slots + threadIdx.x / threads < a.rows;
      v[r] = 0.0f;
      c[r] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (live && t + k * threads < n_packs) {
          const PackFloats<T> xf = widen_pack(xp[r][k]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float d = xf.v[j] - mean[r];
            c[r] += d;
            v[r] += d * d;
          }
        }
    }
    rows_sum<R>(v, threads, scratch);
    rows_sum<R>(c, threads, scratch);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float shift = c[r] / float(a.hidden);
      mean[r] += shift;
      v[r] = fmaxf(v[r] - c[r] * shift, 0.0f);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + int64_t(r) * slots + threadIdx.x / threads;
      if (row >= a.rows) continue;
      const float rstd = rstd_of<T>(v[r], a.hidden, a.eps);
      T* y = a.y + row * a.y_stride;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = t + k * threads;
        if (i < n_packs) {
          // By 32-bit words (Note [word-wise packs] in cuda_fast.cu): the bf16 K = 2 kernel
          // spilled 28 bytes element by element; 16 x 4,096 bf16 2.54 -> 2.45 us on an H200.
          PackFloats<T> f = widen_pack(xp[r][k]);
          const PackFloats<T> wf = widen_pack(wp[k]);
          PackFloats<T> bf{};
          if (has_b) bf = widen_pack(bp[k]);
#pragma unroll
          for (int j = 0; j < N; ++j) f.v[j] = (f.v[j] - mean[r]) * rstd * wf.v[j] + bf.v[j];
          store_pack(y + i * N, narrow_pack(f));
        }
      }
    }
  }
}

// ---- backward: dw, db from partials [parts, 2 * hidden], summed over parts in index order ----------
template <class T>
__global__ void __launch_bounds__(256) dw_db_reduce_kernel(const float* partial, int64_t parts,
                                                           int64_t hidden, T* dw, int64_t dw_stride,
                                                           T* db, int64_t db_stride) {
  programmatic_prologue();  // Note [programmatic launch]
  __shared__ float slice[8][33];
  const int64_t columns = 2 * hidden;
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < columns)
    for (int64_t p = threadIdx.y; p < parts; p += 8) acc += partial[p * columns + col];
  slice[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < columns) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += slice[i][threadIdx.x];
    if (col < hidden) dw[col * dw_stride] = from_f32<T>(sum);
    else db[(col - hidden) * db_stride] = from_f32<T>(sum);
  }
}

// ---- backward, scalar ------------------------------------------------------------------------------
// Block b owns rows [b * rows_per_block, ...) and its partial row (dw at [0, hidden), db at
// [hidden, 2 * hidden)); each thread touches only its own columns of it.
template <class T>
__global__ void __launch_bounds__(256) layer_norm_bwd_rows_kernel(BwdArgs<T> a, float* partial,
                                                                  int64_t rows_per_block) {
  programmatic_prologue();  // Note [programmatic launch]
  __shared__ float scratch[4 * 32];
  float* dw_part = partial + int64_t(blockIdx.x) * 2 * a.hidden;
  float* db_part = dw_part + a.hidden;
  for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) dw_part[c] = db_part[c] = 0.0f;
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  const int64_t last = min(a.rows, first + rows_per_block);
  const float inv_h = 1.0f / float(a.hidden);
  for (int64_t row = first; row < last; ++row) {  // block-uniform
    const T* x = a.x + row * a.x_stride;
    const T* dy = a.dy + row * a.dy_stride;
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) sum += to_f32(x[c]);
    const float mean0 = block_sum(sum, scratch) * inv_h;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // sum d, d^2, g, g * d with d = x - mean0, g = dy * w
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x)
      add_row_sums(s, to_f32(x[c]) - mean0, to_f32(dy[c]) * to_f32(a.w[c * a.w_stride]));
    block_sum_n<4>(s, scratch);
    const CentredRow st = centred_row(s, inv_h);  // Note [backward centring]
    const float rstd = rstd_of<T>(st.m2, a.hidden, a.eps);
    const float mean_g = s[2] * inv_h, mean_gx = st.gd * rstd * inv_h;
    T* dx = a.dx + row * a.dx_stride;
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
      const float xhat = ((to_f32(x[c]) - mean0) - st.shift) * rstd;
      const float gy = to_f32(dy[c]);
      const float g = gy * to_f32(a.w[c * a.w_stride]);
      dx[c] = from_f32<T>(rstd * (g - mean_g - xhat * mean_gx));
      dw_part[c] += gy * xhat;
      db_part[c] += gy;
    }
  }
}

// ---- backward, register-resident -------------------------------------------------------------------
// One row per block step (blockDim.x threads, a multiple of 32); dw and db of the block's chunk
// stay in registers and are written once as the block's partial row.
template <class T, int K>
__global__ void __launch_bounds__(kBwdMaxThreads) layer_norm_bwd_vec_kernel(BwdArgs<T> a,
                                                                            float* partial,
                                                                            int64_t rows_per_block) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int N = Pack<T>::n;
  __shared__ float scratch[4 * 32];
  const int n_packs = int(a.hidden / N);
  const int threads = blockDim.x;
  const float inv_h = 1.0f / float(a.hidden);
  Pack<T> wp[K];
  float dw[K][N], db[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * threads;
    if (i < n_packs) wp[k] = load_pack_readonly(a.w + i * N);
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = db[k][j] = 0.0f;
  }
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  const int64_t last = min(a.rows, first + rows_per_block);
  for (int64_t row = first; row < last; ++row) {  // block-uniform
    const T* x = a.x + row * a.x_stride;
    const T* dy = a.dy + row * a.dy_stride;
    Pack<T> xp[K], gp[K];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * threads;
      if (i < n_packs) {
        xp[k] = load_pack(x + i * N);
        gp[k] = load_pack(dy + i * N);
#pragma unroll
        for (int j = 0; j < N; ++j) sum += to_f32(xp[k].v[j]);
      }
    }
    const float mean0 = block_sum(sum, scratch) * inv_h;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // sum d, d^2, g, g * d with d = x - mean0, g = dy * w
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * threads;
      if (i < n_packs)
#pragma unroll
        for (int j = 0; j < N; ++j)
          add_row_sums(s, to_f32(xp[k].v[j]) - mean0, to_f32(gp[k].v[j]) * to_f32(wp[k].v[j]));
    }
    block_sum_n<4>(s, scratch);
    const CentredRow st = centred_row(s, inv_h);  // Note [backward centring]
    const float rstd = rstd_of<T>(st.m2, a.hidden, a.eps);
    const float mean_g = s[2] * inv_h, mean_gx = st.gd * rstd * inv_h;
    T* dx = a.dx + row * a.dx_stride;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * threads;
      if (i < n_packs) {
        Pack<T> out;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xhat = ((to_f32(xp[k].v[j]) - mean0) - st.shift) * rstd;
          const float gy = to_f32(gp[k].v[j]);
          out.v[j] = from_f32<T>(rstd * (gy * to_f32(wp[k].v[j]) - mean_g - xhat * mean_gx));
          dw[k][j] += gy * xhat;
          db[k][j] += gy;
        }
        store_pack(dx + i * N, out);
      }
    }
  }
  float* dw_part = partial + int64_t(blockIdx.x) * 2 * a.hidden;
  float* db_part = dw_part + a.hidden;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * threads;
    if (i < n_packs)
#pragma unroll
      for (int j = 0; j < N; ++j) {
        dw_part[i * N + j] = dw[k][j];
        db_part[i * N + j] = db[k][j];
      }
  }
}

// ---- launchers -------------------------------------------------------------------------------------
template <class T> void launch_forward(const Context& ctx, const FwdArgs<T>& a, bool vec) {
  if (!vec) {
    const int block = int(std::min<int64_t>(512, std::max<int64_t>(32, (a.hidden + 31) / 32 * 32)));
    launch_programmatic(ctx, "layer_norm_cuda kernel launch", layer_norm_rows_kernel<T>,
                        dim3(grid_for(a.rows, 1)), dim3(block), 0, a);
    return;
  }
  const RowShape s = register_row_shape(a.hidden / Pack<T>::n, kFwdMaxThreads, 256);
  // Rows at once (Note [rows in flight] in ops/norm/cuda.cu): 2 from 4 rows per SM with one pack
  // per thread, one row per block and at most 512 threads; else 1 (short rows already share a
  // block). Not 4 as rms_norm: layer_norm keeps b and the centred pass live, and at R = 4 the
  // 16-bit kernels need about 90 registers (one 512-thread block per SM) or spill at 64; at R = 2
  // they fit 64 (two blocks per SM) without spilling. The K = 2 kernel spills at R = 2.
  const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
  const bool two = a.rows >= 4 * sms && s.k == 1 && s.rows_per_block == 1 && s.block <= 512;
  const unsigned grid = grid_for(a.rows, int64_t(s.rows_per_block) * (two ? 2 : 1));
  auto* kernel = two ? layer_norm_vec_kernel<T, 1, 2>
                : s.k == 1 ? layer_norm_vec_kernel<T, 1, 1> : layer_norm_vec_kernel<T, 2, 1>;
  launch_programmatic(ctx, "layer_norm_cuda_vec16 kernel launch", kernel, dim3(grid), dim3(s.block), 0, a,
                      s.threads);
}

// The fixed chunking of the dw / db partials: G blocks of consecutive rows, G at most the blocks
// resident at once and at least 4 rows a block.
struct Chunks {
  int64_t blocks = 1;
  int64_t rows_per_block = 1;
};
Chunks row_chunks(const Context& ctx, int64_t rows, int threads_per_block) {
  const CudaDeviceProps& p = cuda_device_props(ctx.device.index);
  const int64_t resident =
      int64_t(p.sm_count) * std::max(1, p.max_threads_per_sm / threads_per_block);
  Chunks c;
  c.blocks = std::max<int64_t>(1, std::min((rows + 3) / 4, resident));
  c.rows_per_block = (rows + c.blocks - 1) / c.blocks;
  c.blocks = (rows + c.rows_per_block - 1) / c.rows_per_block;  // no empty block
  return c;
}

template <class T>
void launch_dw_db_reduce(const Context& ctx, const float* partial, int64_t parts, int64_t hidden,
                         const TensorView& dw, const TensorView& db) {
  launch_programmatic(ctx, "layer_norm_backward dw/db reduction launch", dw_db_reduce_kernel<T>,
                      dim3(grid_for(2 * hidden, 32)), dim3(32, 8), 0, partial, parts, hidden, dw.ptr<T>(),
                      dw.stride(0), db.ptr<T>(), db.stride(0));
}

template <class T>
void launch_backward(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw,
                     const TensorView& db, bool vec) {
  if (a.rows == 0) {  // dw, db = sums over no rows
    launch_dw_db_reduce<T>(ctx, nullptr, 0, a.hidden, dw, db);
    return;
  }
  const RowShape s = register_row_shape(a.hidden / Pack<T>::n, kBwdMaxThreads, 0);
  const int block = vec ? s.block : 256;
  const Chunks c = row_chunks(ctx, a.rows, block);
  auto* partial =
      static_cast<float*>(cuda_workspace(ctx, c.blocks * 2 * a.hidden * int64_t(sizeof(float))));
  auto* kernel = !vec ? layer_norm_bwd_rows_kernel<T>
                : s.k == 1 ? layer_norm_bwd_vec_kernel<T, 1> : layer_norm_bwd_vec_kernel<T, 2>;
  launch_programmatic(ctx, vec ? "layer_norm_backward_cuda_vec16 kernel launch" : "layer_norm_backward_cuda kernel launch",
                      kernel, dim3(unsigned(c.blocks)), dim3(block), 0, a, partial, c.rows_per_block);
  launch_dw_db_reduce<T>(ctx, partial, c.blocks, a.hidden, dw, db);
}

void run_forward(const Context& ctx, const TensorView& y, const TensorView& x, const TensorView& w,
                 const TensorView& b, double eps, bool vec) {
  if (x.rows() == 0 || x.size(-1) == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    FwdArgs<T> a{};
    a.y = y.ptr<T>(), a.y_stride = row_stride_of(y);
    a.x = x.ptr<T>(), a.x_stride = row_stride_of(x);
    a.w = w.ptr<T>(), a.w_stride = w.stride(0);
    if (b.defined()) a.b = b.ptr<T>(), a.b_stride = b.stride(0);
    a.rows = x.rows();
    a.hidden = x.size(-1);
    a.eps = float(eps);
    launch_forward<T>(ctx, a, vec);
  });
}

void run_backward(const Context& ctx, const TensorView& dx, const TensorView& dw,
                  const TensorView& db, const TensorView& dy, const TensorView& x,
                  const TensorView& w, double eps, bool vec) {
  if (x.size(-1) == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    BwdArgs<T> a{};
    a.dx = dx.ptr<T>(), a.dx_stride = row_stride_of(dx);
    a.dy = dy.ptr<T>(), a.dy_stride = row_stride_of(dy);
    a.x = x.ptr<T>(), a.x_stride = row_stride_of(x);
    a.w = w.ptr<T>(), a.w_stride = w.stride(0);
    a.rows = x.rows();
    a.hidden = x.size(-1);
    a.eps = float(eps);
    launch_backward<T>(ctx, a, dw, db, vec);
  });
}

// A parameter vector read as packs: contiguous (or a single element) and 16-byte aligned.
const char* vector_pack_problem(const TensorView& v, const char* not_contiguous,
                                const char* not_aligned) {
  if (v.stride(0) != 1 && v.size(0) > 1) return not_contiguous;
  if (!aligned16(v.data)) return not_aligned;
  return nullptr;
}

// Shared by the vec16 predicates: dtype, hidden a multiple of the pack and within the register
// row, w (and b) packable, every row tensor packable.
const char* vec16_problem(std::initializer_list<const TensorView*> rows, const TensorView& x,
                          const TensorView& w, const TensorView* b, int64_t max_packs) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();
  const int64_t hidden = x.size(-1);
  if (hidden % n != 0) return n == 8 ? "hidden % 8 != 0" : "hidden % 4 != 0";
  if (hidden / n > max_packs)
    return max_packs == 2 * kFwdMaxThreads ? "hidden exceeds a register-resident row (2048 packs)"
                                           : "hidden exceeds a register-resident row (1024 packs)";
  if (const char* why = vector_pack_problem(w, "w is not contiguous", "w is not 16-byte aligned"))
    return why;
  if (b && b->defined())
    if (const char* why = vector_pack_problem(*b, "b is not contiguous", "b is not 16-byte aligned"))
      return why;
  for (const TensorView* t : rows)
    if (const char* why = pack_rows_problem(*t, hidden)) return why;
  return nullptr;
}

}  // namespace
}  // namespace cuda::layernorm

void layer_norm_cuda(const Context& ctx, const TensorView& y, const TensorView& x,
                     const TensorView& w, const TensorView& b, double eps) {
  cuda::layernorm::run_forward(ctx, y, x, w, b, eps, false);
}
const char* layer_norm_cuda_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                       const TensorView&, double) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void layer_norm_cuda_vec16(const Context& ctx, const TensorView& y, const TensorView& x,
                           const TensorView& w, const TensorView& b, double eps) {
  cuda::layernorm::run_forward(ctx, y, x, w, b, eps, true);
}
const char* layer_norm_cuda_vec16_applicable(const TensorView& y, const TensorView& x,
                                             const TensorView& w, const TensorView& b, double) {
  return cuda::layernorm::vec16_problem({&y, &x}, x, w, &b, 2 * cuda::layernorm::kFwdMaxThreads);
}

void layer_norm_backward_cuda(const Context& ctx, const TensorView& dx, const TensorView& dw,
                              const TensorView& db, const TensorView& dy, const TensorView& x,
                              const TensorView& w, double eps) {
  cuda::layernorm::run_backward(ctx, dx, dw, db, dy, x, w, eps, false);
}
const char* layer_norm_backward_cuda_applicable(const TensorView&, const TensorView&,
                                                const TensorView&, const TensorView&,
                                                const TensorView& x, const TensorView&, double) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void layer_norm_backward_cuda_vec16(const Context& ctx, const TensorView& dx, const TensorView& dw,
                                    const TensorView& db, const TensorView& dy,
                                    const TensorView& x, const TensorView& w, double eps) {
  cuda::layernorm::run_backward(ctx, dx, dw, db, dy, x, w, eps, true);
}
const char* layer_norm_backward_cuda_vec16_applicable(const TensorView& dx, const TensorView&,
                                                      const TensorView&, const TensorView& dy,
                                                      const TensorView& x, const TensorView& w,
                                                      double) {
  return cuda::layernorm::vec16_problem({&dx, &dy, &x}, x, w, nullptr,
                                        2 * cuda::layernorm::kBwdMaxThreads);
}

void register_layernorm_cuda(Registry& reg) {
  register_layernorm_cuda_fast(reg);  // cuda_fast.cu: the priority-300 kernels
  reg.add_kernel<LayerNorm>(
      cuda_kernel_desc("cuda_vec16", 200,
                       "16-byte packs, row held in registers (x read once), centred f32 "
                       "statistics by warp/block reductions",
                       true),
      &layer_norm_cuda_vec16, &layer_norm_cuda_vec16_applicable);
  reg.add_kernel<LayerNorm>(
      cuda_kernel_desc("cuda", 100, "any layout: one block per row, scalar loads, three passes, f32",
                       true),
      &layer_norm_cuda, &layer_norm_cuda_applicable);
  // dw and db sum over every row in f32 (per-block partials, then a fixed-order sum of the
  // partials) while the reference sums in f64: f32 gets atol 1e-4 as the cpu kernel and the
  // rms_norm backward CUDA kernels (Note [f32 dw tolerance] in ops/norm/cuda.cu).
  auto bwd_desc = [](const char* impl, int priority, const char* summary) {
    KernelDesc d = cuda_kernel_desc(impl, priority, summary, false);
    d.tolerances[DType::f32] = Tolerance{1e-4, 1e-4, 1e-10};
    return d;
  };
  reg.add_kernel<LayerNormBackward>(
      bwd_desc("cuda_vec16", 200,
               "16-byte packs in registers (x, dy read once); per-block f32 dw/db partials "
               "reduced in fixed order by a second launch"),
      &layer_norm_backward_cuda_vec16, &layer_norm_backward_cuda_vec16_applicable);
  reg.add_kernel<LayerNormBackward>(
      bwd_desc("cuda", 100,
               "any layout: scalar loads, three passes, per-block f32 dw/db partials reduced in "
               "fixed order"),
      &layer_norm_backward_cuda, &layer_norm_backward_cuda_applicable);
}

}  // namespace opforge
