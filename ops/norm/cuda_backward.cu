// CUDA backward kernels of the norm family: rms_norm_backward and fused_add_rms_norm_backward.
//
// Math (rms_norm_backward's doc): r = 1/sqrt(mean(x^2) + eps), m = dy * (w + offset),
// dx = r*m - (r^3 / hidden) * sum(m*x) * x, dw = sum over rows of dy * x * r. The fused op runs
// the same on s = round(x + residual) (recomputed, never stored) and writes
// dx = dresidual = that + ds.
//
// Technique.
//  - Note [deterministic dw]: the grid is a fixed number of blocks G (from the SM count and the
//    kernel's occupancy), block b owns the row chunk [b*C, (b+1)*C). Each block accumulates its dw in
//    f32 (registers in vec16, its own workspace row in the scalar kernel) and writes one row of
//    partials [G, hidden] to the per-stream workspace (Note [cuda workspace]); the partials of each
//    column are then summed in a fixed order and rounded once (by a second kernel after the scalar
//    kernel, after a grid barrier inside the vec16 kernel). No float atomics: the bits
//    depend only on the inputs, the device's SM count and the kernel's occupancy (fixed per build).
//  - cuda_vec16 (priority 200): Note [register-resident row] with up to 512 threads x 2 packs of
//    16 bytes (hidden 8192 bf16, 4096 f32); x, dy (and residual, ds) read once per row
//    (Note [rows in flight, backward]); the row sums (sum x^2, sum m*x) reduced together (Note [cuda reductions]); w held in registers for the whole chunk. One cooperative launch that also reduces dw (Note [one-launch dw]).
//    Few rows (up to 32 at hidden 4,096 bf16) go to one thread-block cluster (Note [few-row
//    backward cluster]); from 16 rows an SM on (4 with the residual) the rows stream through
//    shared memory filled by bulk copies (Note [bulk-copy row pipeline], cuda_backward_bulk.cu).
//    At a few rows a block, where reading x and dy again moves fewer bytes than the partial rows,
//    dw is summed by columns after the grid barrier instead (Note [column dw], cuda_backward.cuh).
//  - cuda (priority 100): any layout; scalar loads, two passes over each row.
//  f32 arithmetic, int64 indexing, launches on ctx.stream, no host synchronization; the workspace
//  is allocated only on the first call with a larger shape. The scalar kernel and the dw
//  reduction are launched programmatically (Note [programmatic launch] in cuda_launch.cuh).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>

#include "ops/norm/cuda_backward.cuh"

namespace opforge {
namespace cuda::norm {
namespace {

namespace cg = cooperative_groups;

// The fixed chunking of Note [deterministic dw].
struct Chunks {
  int64_t blocks = 1;
  int64_t rows_per_block = 1;
};
Chunks dw_chunks(const Context& ctx, int64_t rows, int threads_per_block) {
  const CudaDeviceProps& p = cuda_device_props(ctx.device.index);
  const int64_t resident = int64_t(p.sm_count) * std::max(1, p.max_threads_per_sm / threads_per_block);
  Chunks c;
  c.blocks = std::max<int64_t>(1, std::min((rows + 3) / 4, resident));
  c.rows_per_block = (rows + c.blocks - 1) / c.blocks;
  c.blocks = (rows + c.rows_per_block - 1) / c.rows_per_block;  // no empty block
  return c;
}

// ---- dw: sum partials [parts, hidden] over parts in index order ------------------------------------
template <class T>
__global__ void __launch_bounds__(256) dw_reduce_kernel(const float* partial, int64_t parts,
                                                        int64_t hidden, T* dw, int64_t dw_stride) {
  programmatic_prologue();  // Note [programmatic launch]
  __shared__ float slice[8][33];
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < hidden)
    for (int64_t p = threadIdx.y; p < parts; p += 8) acc += partial[p * hidden + col];
  slice[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += slice[i][threadIdx.x];
    dw[col * dw_stride] = from_f32<T>(sum);
  }
}

template <class T>
void launch_dw_reduce(const Context& ctx, const float* partial, int64_t parts, int64_t hidden,
                      const TensorView& dw) {
  launch_programmatic(ctx, "norm backward dw reduction launch", dw_reduce_kernel<T>, dim3(grid_for(hidden, 32)),
                      dim3(32, 8), 0, partial, parts, hidden, dw.ptr<T>(), dw.stride(0));
}

// ---- scalar kernel ---------------------------------------------------------------------------------
template <class T, bool kFused>
__device__ __forceinline__ float input_at(const BwdArgs<T>& a, int64_t row, int64_t c) {
  const float x = to_f32(a.x[row * a.x_stride + c]);
  if constexpr (kFused) return to_f32(from_f32<T>(x + to_f32(a.r[row * a.r_stride + c])));
  return x;
}

template <class T, bool kFused>
__global__ void __launch_bounds__(256) rms_norm_bwd_rows_kernel(BwdArgs<T> a, float* partial,
                                                                int64_t rows_per_block) {
  programmatic_prologue();  // Note [programmatic launch]
  __shared__ float2 scratch[32];
  float* dw_part = partial + int64_t(blockIdx.x) * a.hidden;  // this thread's columns only
  for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) dw_part[c] = 0.0f;
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  const int64_t last = min(a.rows, first + rows_per_block);
  for (int64_t row = first; row < last; ++row) {
    const T* dy = a.dy + row * a.dy_stride;
    float2 sums = make_float2(0.0f, 0.0f);
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
      const float v = input_at<T, kFused>(a, row, c);
      const float m = to_f32(dy[c]) * (to_f32(a.w[c * a.w_stride]) + a.offset);
      sums.x += v * v;
      sums.y += m * v;
    }
    const float2 k = row_scales(block_sum2(sums, scratch), a);
    for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
      const float v = input_at<T, kFused>(a, row, c);
      const float g = to_f32(dy[c]);
      float dx = k.x * g * (to_f32(a.w[c * a.w_stride]) + a.offset) - k.y * v;
      if constexpr (kFused) dx += to_f32(a.ds[row * a.ds_stride + c]);
      a.dx[row * a.dx_stride + c] = from_f32<T>(dx);
      if constexpr (kFused) a.dr[row * a.dr_stride + c] = from_f32<T>(dx);
      dw_part[c] += g * v * k.x;
    }
  }
}

// ---- register-resident kernel ----------------------------------------------------------------------
// dx (and dresidual) of one pack, given the row's scales k = (r, r^3/H * sum m*x). kWords: the
// packs widen and round by 32-bit words (widen_pack / narrow_pack), the same values; the few-row
// cluster kernel uses it (its bf16 form spilled 10-12 bytes element by element and none by words:
// H200, 16 x 4,096 bf16, rms_norm_backward 4.49 -> 4.18-4.21 us, fused_add_rms_norm_backward 5.20
// -> 4.66, docs/perf/gpu-h200-2026-11-28-round17.md). The vec16 kernel keeps the element form:
// by words it ran 1-1.5% slower at 16,384 rows.
template <class T, bool kFused, bool kWords = false>
__device__ __forceinline__ void store_dx_pack(const BwdRow<T>& p, int col, const Pack<T>& xp,
                                              const Pack<T>& gp, const Pack<T>& wp, float offset,
                                              float2 k, float* dw) {
  constexpr int N = Pack<T>::n;
  if constexpr (kWords) {
    const PackFloats<T> xf = widen_pack(xp), gf = widen_pack(gp), wf = widen_pack(wp);
    PackFloats<T> dsf, out;
    if constexpr (kFused) dsf = widen_pack(load_pack(p.ds + col));
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float v = xf.v[j], g = gf.v[j];
      float dx = k.x * g * (wf.v[j] + offset) - k.y * v;
      if constexpr (kFused) dx += dsf.v[j];
      out.v[j] = dx;
      dw[j] += g * v * k.x;
    }
    const Pack<T> rounded = narrow_pack(out);
    store_pack(p.dx + col, rounded);
    if constexpr (kFused) store_pack(p.dr + col, rounded);
  } else {
    Pack<T> out;
    Pack<T> dsp;
    if constexpr (kFused) dsp = load_pack(p.ds + col);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float v = to_f32(xp.v[j]), g = to_f32(gp.v[j]);
      float dx = k.x * g * (to_f32(wp.v[j]) + offset) - k.y * v;
      if constexpr (kFused) dx += to_f32(dsp.v[j]);
      out.v[j] = from_f32<T>(dx);
      dw[j] += g * v * k.x;
    }
    store_pack(p.dx + col, out);
    if constexpr (kFused) store_pack(p.dr + col, out);
  }
}

// Note [one-launch dw]: the vec16 kernel is launched cooperatively (every block resident). Phase 1:
// block b runs its row chunk, keeping its dw in registers, and writes them as row b of partials
// [G, hidden]. A grid barrier (Note [grid barrier]). Phase 2: block b sums the G partials of its
// slice of ceil(hidden / G) columns, each column in a fixed order (threads stride over the
// partials, then a fixed-order sum of their results in shared memory), and writes dw. One launch
// instead of two; G is at least hidden / threads so that phase 2 gives each thread a handful of
// independent loads.
//
// Note [rows in flight, backward]: the kernel can load its packs of R rows (x, dy and the
// residual) before reducing them together, as the forward does (Note [rows in flight] in cuda.cu),
// but one row at a time is the measured best, so R = 1 unless OPFORGE_CUDA_NORM_ROWS asks for
// more. At R = 1 two 512-thread blocks share an SM (64 registers); at R >= 2 the x, dy, w values,
// their f32 copies and the dw accumulators need more than 64 registers (at that cap the kernel
// spilled and ran at a third of the speed), so it runs one block per SM, whose load phases no
// other block covers. H200, 16384 x 4096 bf16, % of copy for rms_norm_backward / fused: R = 1
// 69% / 82%, R = 2 48% / 65%, R = 4 51% / (spills, not run). Prefetching the next row while
// reducing the current one was also slower (65% / 79%).
// kColumns: Note [column dw] (R = 1 only): `partial` holds each row's r instead of partial rows.
template <class T, int K, int R, bool kFused, bool kColumns = false>
__global__ void __launch_bounds__(kBwdMaxThreads, R == 1 && K == 1 ? 2 : 1)
    rms_norm_bwd_vec_kernel(BwdArgs<T> a, float* partial, int64_t rows_per_block, bool strided,
                            unsigned* barrier, T* dw_out, int64_t dw_stride) {
  static_assert(!kColumns || R == 1, "column dw: one row at a time");
  constexpr int N = Pack<T>::n;
  __shared__ float scratch[2 * R * 32];
  __shared__ float slice[kBwdMaxThreads];
  programmatic_prologue();  // Note [programmatic launch]
  const int n_packs = int(a.hidden / N);
  const int threads = blockDim.x;
  Pack<T> wp[K];
  float dw[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * threads;
    if (i < n_packs) wp[k] = load_pack_readonly(a.w + i * N);
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = 0.0f;
  }
  // Note [row order] (cuda_backward.cuh); R rows at a time (tuning) take chunks.
  const BlockRows rows = block_rows(a.rows, rows_per_block, strided && R == 1);
  const int64_t last = rows.end;
  for (int64_t base = rows.begin; base < last; base += R * rows.step) {  // block-uniform
    Pack<T> xp[R][K], gp[R][K];
    Pack<T> rp[kFused ? R : 1][K];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = base + r < last;
      const BwdRow<T> p = bwd_row<T, kFused>(a, live ? base + r : rows.begin);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = threadIdx.x + k * threads;
        if (live && i < n_packs) {
          xp[r][k] = load_pack(p.x + i * N);
          gp[r][k] = load_pack(p.dy + i * N);
          if constexpr (kFused) rp[r][k] = load_pack(p.r + i * N);
        }
      }
    }
    float sums[2 * R];  // (sum x^2, sum m*x) of each row
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sums[2 * r] = sums[2 * r + 1] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = threadIdx.x + k * threads;
        if (base + r < last && i < n_packs) {
          if constexpr (kFused) xp[r][k] = rounded_sum(xp[r][k], rp[r][k]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float v = to_f32(xp[r][k].v[j]);
            sums[2 * r] += v * v;
            sums[2 * r + 1] += to_f32(gp[r][k].v[j]) * (to_f32(wp[k].v[j]) + a.offset) * v;
          }
        }
      }
    }
    block_sum_n<2 * R>(sums, scratch);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (base + r >= last) continue;
      const BwdRow<T> p = bwd_row<T, kFused>(a, base + r);
      const float2 scale = row_scales(make_float2(sums[2 * r], sums[2 * r + 1]), a);
      if (kColumns && threadIdx.x == 0) partial[base + r] = scale.x;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = threadIdx.x + k * threads;
        if (i < n_packs)  // with kColumns dw is never read: the compiler drops its sums
          store_dx_pack<T, kFused>(p, i * N, xp[r][k], gp[r][k], wp[k], a.offset, scale, dw[k]);
      }
    }
  }
  if constexpr (kColumns) {
    grid_barrier(barrier, gridDim.x);
    rms_dw_by_columns<T, kFused>(a, partial, slice, dw_out, dw_stride);
  } else {
    store_partial_row<T, K>(partial + int64_t(blockIdx.x) * a.hidden, a.hidden, dw);
    grid_barrier(barrier, gridDim.x);
    dw_from_partials(partial, a.hidden, slice, dw_out, dw_stride);
  }
}

// ---- few rows: one cluster ------------------------------------------------------------------------
// Note [few-row backward cluster] (compute capability 9.0 on; Note [cluster launch]): with a
// handful of rows (16 tokens), the row-chunked kernel gives a few SMs a row each and then needs a
// grid barrier for dw. Here one thread-block cluster of C CTAs (C <= 16; above 8 the non-portable
// sizes of sm_90, from 8 rows on: fitting_cluster_plan in cuda_backward.cuh) takes the whole problem
// cut by columns: CTA c owns the packs [c * P, (c + 1) * P) of every row, and its threads form G
// row groups of P' = P rounded up to a warp (thread (g, p): pack p of rows g, g + G, ..., at most
// RT = 2 rows a thread, all loaded at once). Then:
//  - each row's (sum x^2, sum m*x) over the CTA's columns: warp butterflies, then the warps of a
//    row group in order; the CTA's row partials go to its shared memory, and after a cluster
//    barrier every CTA adds the C partials of each row in rank order through distributed shared
//    memory (every CTA gets the same bits);
//  - dx from registers (store_dx_pack), and dw of the CTA's columns is complete inside the CTA
//    (it holds every row of them): the threads' dw go to shared memory and one thread per column
//    adds them over the G groups in order and writes dw. No workspace, no second kernel, one
//    launch. Deterministic for a given shape and device.
// Taken when RT <= 2 (at hidden 4096 bf16: up to 32 rows); more rows go to the chunked kernel,
// which spreads them over the whole card.
// The plan (ClusterPlan) and the cross-CTA sums (ClusterRowSums, cluster_column_sums) are in
// cuda_backward.cuh: layer_norm_backward's cluster kernel takes them too.
template <class T, int RT, bool kFused>
__global__ void __launch_bounds__(kClusterMaxThreads) rms_norm_bwd_cluster_kernel(BwdArgs<T> a, int packs, int padded,
                                                                                 int groups, T* dw_out,
                                                                                 int64_t dw_stride) {
  constexpr int N = Pack<T>::n;
  __shared__ ClusterRowSums<2, RT> sh;
  __shared__ float dw_stage[kClusterMaxThreads * N];  // G x N x P' floats, G x P' <= 1024
  programmatic_prologue();  // Note [programmatic launch]
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int n_packs = int(a.hidden / N);
  const int g = threadIdx.x / padded, pl = threadIdx.x % padded;
  const int pack = int(rank) * packs + pl;
  const bool col_live = pl < packs && pack < n_packs;
  const int col = pack * N;
  Pack<T> wp, xp[RT], gp[RT], rp[kFused ? RT : 1];
  if (col_live) wp = load_pack_readonly(a.w + col);
#pragma unroll
  for (int s = 0; s < RT; ++s) {
    const int64_t row = g + int64_t(s) * groups;
    if (col_live && row < a.rows) {
      const BwdRow<T> p = bwd_row<T, kFused>(a, row);
      xp[s] = load_pack(p.x + col);
      gp[s] = load_pack(p.dy + col);
      if constexpr (kFused) rp[s] = load_pack(p.r + col);
    }
  }
  float sums[RT][2];  // sum x^2, sum m*x
#pragma unroll
  for (int s = 0; s < RT; ++s) {
    const int64_t row = g + int64_t(s) * groups;
    sums[s][0] = sums[s][1] = 0.0f;
    if (col_live && row < a.rows) {
      if constexpr (kFused) xp[s] = rounded_sum(xp[s], rp[s]);
      const PackFloats<T> xf = widen_pack(xp[s]), gf = widen_pack(gp[s]), wf = widen_pack(wp);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float v = xf.v[j];
        sums[s][0] += v * v;
        sums[s][1] += gf.v[j] * (wf.v[j] + a.offset) * v;
      }
    }
  }
  cta_row_sums(sums, sh, groups, padded, a.rows);
  cluster.sync();
  cluster_row_totals(cluster, sh, groups, a.rows);
  cluster_arrive();  // done with the other CTAs' shared memory
  __syncthreads();   // sh.total
  float dw[N];
#pragma unroll
  for (int j = 0; j < N; ++j) dw[j] = 0.0f;
#pragma unroll
  for (int s = 0; s < RT; ++s) {
    const int64_t row = g + int64_t(s) * groups;
    if (col_live && row < a.rows)
      store_dx_pack<T, kFused, true>(bwd_row<T, kFused>(a, row), col, xp[s], gp[s], wp, a.offset,
                                     row_scales(make_float2(sh.total[row][0], sh.total[row][1]), a), dw);
  }
  // dw of the CTA's columns is complete inside the CTA (one thread adding a pack's N columns over
  // 16 groups took 1 us more at 16 x 4096 than the column-parallel sums).
  cluster_column_sums(dw, dw_stage, g, pl, padded, packs, groups, int(rank) * packs, n_packs,
                      [&](int c, float total) { dw_out[int64_t(c) * dw_stride] = from_f32<T>(total); });
  cluster_wait();  // no CTA leaves while another may still read its partials
}

template <class T, bool kFused>
bool launch_bwd_cluster(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw) {
  if (!cluster_rows_enabled()) return false;
  const void* const kernels[2] = {reinterpret_cast<const void*>(rms_norm_bwd_cluster_kernel<T, 1, kFused>),
                                  reinterpret_cast<const void*>(rms_norm_bwd_cluster_kernel<T, 2, kFused>)};
  static const bool wide = allow_wide_clusters(kernels[0]) && allow_wide_clusters(kernels[1]);
  const ClusterPlan c = fitting_cluster_plan(ctx.device.index, a.rows, a.hidden / Pack<T>::n, kernels, wide);
  if (c.ranks == 0) return false;
  auto kernel = c.rows_per_thread == 1 ? rms_norm_bwd_cluster_kernel<T, 1, kFused> : rms_norm_bwd_cluster_kernel<T, 2, kFused>;
  launch_cluster(ctx,
                 kFused ? "fused_add_rms_norm_backward_cuda_vec16 cluster launch"
                        : "rms_norm_backward_cuda_vec16 cluster launch",
                 kernel, dim3(unsigned(c.ranks)), dim3(unsigned(c.groups * c.padded)), 0, c.ranks, a, c.packs,
                 c.padded, c.groups, dw.ptr<T>(), int64_t(dw.stride(0)));
  return true;
}

// ---- launchers -------------------------------------------------------------------------------------
template <class T, int K, int R, bool kFused>
void launch_vec_coop(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, int block) {
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  // Blocks of an instantiation that fit on one SM, cached per block size (a cooperative launch of
  // more blocks than fit is refused).
  auto fitting = [&](auto kernel, std::atomic<int>(&per_sm)[kBwdMaxThreads / 32 + 1]) {
    int fit = per_sm[block / 32].load(std::memory_order_relaxed);
    if (fit == 0) {
      OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, block, 0));
      fit = std::max(fit, 1);
      per_sm[block / 32].store(fit, std::memory_order_relaxed);
    }
    return int64_t(fit) * props.sm_count;
  };
  static std::atomic<int> per_sm_rows[kBwdMaxThreads / 32 + 1], per_sm_columns[kBwdMaxThreads / 32 + 1];
  constexpr bool kCanColumns = R == 1;  // Note [column dw]: one row at a time
  auto rows_kernel = rms_norm_bwd_vec_kernel<T, K, R, kFused, false>;
  auto columns_kernel = rms_norm_bwd_vec_kernel<T, K, R, kFused, kCanColumns>;
  OneLaunchGrid g = one_launch_grid(a.rows, a.hidden, fitting(rows_kernel, per_sm_rows), block, R);
  const int64_t reread = (kFused ? 3 : 2) * a.rows * a.hidden * int64_t(sizeof(T));  // x, dy (, residual)
  const int64_t partials = 2 * g.blocks * a.hidden * int64_t(sizeof(float));
  const bool columns = kCanColumns && column_dw_pays(props, a.rows, reread, partials);
  if (columns) g = one_launch_grid(a.rows, a.hidden, fitting(columns_kernel, per_sm_columns), block, R);
  const int64_t floats = columns ? a.rows : g.blocks * a.hidden;  // rows' r, or partial rows
  auto* partial = static_cast<float*>(cuda_workspace(ctx, floats * int64_t(sizeof(float))));
  unsigned* barrier = cuda_grid_barrier(ctx);
  launch_cooperative(ctx,
                     kFused ? "fused_add_rms_norm_backward_cuda_vec16 cooperative launch"
                            : "rms_norm_backward_cuda_vec16 cooperative launch",
                     columns ? columns_kernel : rows_kernel, g.blocks, block, 0, a, partial, g.rows_per_block,
                     bulk_rows_strided(), barrier, dw.ptr<T>(), int64_t(dw.stride(0)));
}

template <class T, bool kFused>
void launch_backward(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, bool vec) {
  if (a.rows == 0) {  // dw = a sum over no rows
    launch_dw_reduce<T>(ctx, nullptr, 0, a.hidden, dw);
    return;
  }
  if (vec) {
    if (launch_bwd_cluster<T, kFused>(ctx, a, dw)) return;  // Note [few-row backward cluster]
    if (launch_bwd_bulk<T, kFused>(ctx, a, dw)) return;     // Note [bulk-copy row pipeline]
    const RowShape s = register_row_shape(a.hidden / Pack<T>::n, kBwdMaxThreads, 0);
    // Note [rows in flight, backward].
    const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
    const int r = a.rows >= 4 * sms ? std::min(max_rows_at_once(kFused, true), 4 / s.k) : 1;
    if (s.k == 1) {
      if (r >= 4) launch_vec_coop<T, 1, 4, kFused>(ctx, a, dw, s.block);
      else if (r == 2) launch_vec_coop<T, 1, 2, kFused>(ctx, a, dw, s.block);
      else launch_vec_coop<T, 1, 1, kFused>(ctx, a, dw, s.block);
    } else {
      if (r >= 2) launch_vec_coop<T, 2, 2, kFused>(ctx, a, dw, s.block);
      else launch_vec_coop<T, 2, 1, kFused>(ctx, a, dw, s.block);
    }
    return;
  }
  const int block = 256;
  const Chunks c = dw_chunks(ctx, a.rows, block);
  auto* partial = static_cast<float*>(cuda_workspace(ctx, c.blocks * a.hidden * int64_t(sizeof(float))));
  launch_programmatic(ctx, kFused ? "fused_add_rms_norm_backward kernel launch" : "rms_norm_backward kernel launch",
                      rms_norm_bwd_rows_kernel<T, kFused>, dim3(unsigned(c.blocks)), dim3(block), 0, a, partial,
                      c.rows_per_block);
  launch_dw_reduce<T>(ctx, partial, c.blocks, a.hidden, dw);
}

struct BwdViews {
  const TensorView* dx;
  const TensorView* dr;  // fused only
  const TensorView* dw;
  const TensorView* dy;
  const TensorView* ds;  // fused only
  const TensorView* x;
  const TensorView* r;   // fused only
  const TensorView* w;
};

template <class T> BwdArgs<T> bwd_args(const BwdViews& v, double eps, double offset) {
  BwdArgs<T> a{};
  a.dx = v.dx->ptr<T>(), a.dx_stride = row_stride_of(*v.dx);
  a.dy = v.dy->ptr<T>(), a.dy_stride = row_stride_of(*v.dy);
  a.x = v.x->ptr<T>(), a.x_stride = row_stride_of(*v.x);
  a.w = v.w->ptr<T>(), a.w_stride = v.w->stride(0);
  if (v.dr) a.dr = v.dr->ptr<T>(), a.dr_stride = row_stride_of(*v.dr);
  if (v.ds) a.ds = v.ds->ptr<T>(), a.ds_stride = row_stride_of(*v.ds);
  if (v.r) a.r = v.r->ptr<T>(), a.r_stride = row_stride_of(*v.r);
  a.rows = v.x->rows();
  a.hidden = v.x->size(-1);
  a.eps = float(eps);
  a.offset = float(offset);
  return a;
}

template <bool kFused>
void run_backward(const Context& ctx, const BwdViews& v, double eps, double offset, bool vec) {
  if (v.x->size(-1) == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(v.x->dtype, kFused ? "fused_add_rms_norm_backward" : "rms_norm_backward",
                 [&](auto tag) {
                   using T = decltype(tag);
                   launch_backward<T, kFused>(ctx, bwd_args<T>(v, eps, offset), *v.dw, vec);
                 });
}

const char* bwd_vec16_problem(std::initializer_list<const TensorView*> rows, const TensorView& x,
                              const TensorView& w) {
  if (const char* why = vec16_common_problem(x, w, 2 * kBwdMaxThreads)) return why;
  for (const TensorView* t : rows)
    if (const char* why = pack_rows_problem(*t, x.size(-1))) return why;
  return nullptr;
}

}  // namespace
}  // namespace cuda::norm

using cuda::norm::BwdViews;
using cuda::norm::run_backward;

// ---- rms_norm_backward -------------------------------------------------------------------------------
void rms_norm_backward_cuda(const Context& ctx, const TensorView& dx, const TensorView& dw,
                            const TensorView& dy, const TensorView& x, const TensorView& w,
                            double eps, double offset) {
  run_backward<false>(ctx, BwdViews{&dx, nullptr, &dw, &dy, nullptr, &x, nullptr, &w}, eps, offset,
                      false);
}
const char* rms_norm_backward_cuda_applicable(const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView& x,
                                              const TensorView&, double, double) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void rms_norm_backward_cuda_vec16(const Context& ctx, const TensorView& dx, const TensorView& dw,
                                  const TensorView& dy, const TensorView& x, const TensorView& w,
                                  double eps, double offset) {
  run_backward<false>(ctx, BwdViews{&dx, nullptr, &dw, &dy, nullptr, &x, nullptr, &w}, eps, offset,
                      true);
}
const char* rms_norm_backward_cuda_vec16_applicable(const TensorView& dx, const TensorView&,
                                                    const TensorView& dy, const TensorView& x,
                                                    const TensorView& w, double, double) {
  return cuda::norm::bwd_vec16_problem({&dx, &dy, &x}, x, w);
}

// ---- fused_add_rms_norm_backward ---------------------------------------------------------------------
void fused_add_rms_norm_backward_cuda(const Context& ctx, const TensorView& dx,
                                      const TensorView& dresidual, const TensorView& dw,
                                      const TensorView& dy, const TensorView& ds,
                                      const TensorView& x, const TensorView& residual,
                                      const TensorView& w, double eps, double offset) {
  run_backward<true>(ctx, BwdViews{&dx, &dresidual, &dw, &dy, &ds, &x, &residual, &w}, eps, offset,
                     false);
}
const char* fused_add_rms_norm_backward_cuda_applicable(
    const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
    const TensorView& x, const TensorView&, const TensorView&, double, double) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void fused_add_rms_norm_backward_cuda_vec16(const Context& ctx, const TensorView& dx,
                                            const TensorView& dresidual, const TensorView& dw,
                                            const TensorView& dy, const TensorView& ds,
                                            const TensorView& x, const TensorView& residual,
                                            const TensorView& w, double eps, double offset) {
  run_backward<true>(ctx, BwdViews{&dx, &dresidual, &dw, &dy, &ds, &x, &residual, &w}, eps, offset,
                     true);
}
const char* fused_add_rms_norm_backward_cuda_vec16_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView&, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double, double) {
  return cuda::norm::bwd_vec16_problem({&dx, &dresidual, &dy, &ds, &x, &residual}, x, w);
}

}  // namespace opforge
