// Parts shared by the register-resident backward kernels of the norm family (cuda_backward.cu)
// and the bulk-copy pipelines (cuda_backward_bulk.cu, ops/layernorm/cuda_backward_bulk.cu): row
// scales, row pointers, the dw partials with their fixed-order reduction (Note [one-launch dw]),
// the rows of a block (Note [row order]), a pipeline's ring and launch plan, and the few-row
// cluster's plan and its cross-CTA sums (Note [few-row backward cluster], also taken by
// ops/layernorm/cuda_backward_cluster.cu).
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "ops/norm/cluster_plan.h"
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

// A block's accumulators (K packs a thread, `hidden` columns) as one row of partials, at `dst`.
template <class T, int K>
__device__ __forceinline__ void store_partial_row(float* dst, int64_t hidden, const float (&acc)[K][Pack<T>::n]) {
  constexpr int N = Pack<T>::n;
  const int n_packs = int(hidden / N);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n_packs)
#pragma unroll
      for (int j = 0; j < N; j += 4)
        *reinterpret_cast<float4*>(dst + i * N + j) =
            make_float4(acc[k][j], acc[k][j + 1], acc[k][j + 2], acc[k][j + 3]);
  }
}

// Note [column dw]: at a few rows a block, the partial rows of Note [one-launch dw] cost about
// what the rows do: [G, hidden] floats written, the grid barrier, then read back (H200, bf16 1,024
// x 4,096 rms_norm_backward: 8.3 us for the rows, 5.6 more for dw; round 26). Where reading the
// call's inputs again moves fewer bytes (column_dw_pays), phase 1 writes only S floats a row (the
// row's statistics, `stats` [rows, S]) and phase 2 reads the rows' x and dy again, from L2, by
// columns: block b takes column units b, b + G, ... (a unit is two 16-byte packs of a row, lanes
// 2q and 2q + 1 of each warp), lane pair q of warp w the rows q + 16 w + 16 W k (W warps) in
// increasing order, kBatch rows' loads in flight. Each thread sums its rows' terms in f32, a
// butterfly adds the 16 pairs of a warp, then thread t < 2 M N adds the warps' sums in order from
// shared memory and hands column total m to out(m, column, total). The order depends on the row
// count and the block size only (not on G or timing): the same bits every run. `load(row, pack)`
// returns what a row contributes to a pack, `add(item, acc)` adds it to acc[M][N]; `red` holds
// 2 M N W floats (at most 512 for M = 2 and 16-bit packs: blocks of up to 512 threads).
template <class T, int M, int kBatch, class Load, class Add, class Out>
__device__ __forceinline__ void column_sums(int64_t rows, int n_packs, float* red, Load load, Add add, Out out) {
  static_assert(kBatch == 2 || kBatch == 4, "column_sums: 2 or 4 rows in flight");
  constexpr int N = Pack<T>::n;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int half = lane & 1, q = lane >> 1;
  const int64_t step = 16 * int64_t(warps);
  const int units = (n_packs + 1) / 2;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {  // block-uniform
    const int pack = 2 * u + half;
    float acc[M][N];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < N; ++j) acc[m][j] = 0.0f;
    if (pack < n_packs) {
      int64_t r = q + 16 * warp;
      for (; r + (kBatch - 1) * step < rows; r += kBatch * step) {  // the batch's loads issued together
        if constexpr (kBatch == 4) {
          const auto i0 = load(r, pack), i1 = load(r + step, pack), i2 = load(r + 2 * step, pack),
                     i3 = load(r + 3 * step, pack);
          add(i0, acc), add(i1, acc), add(i2, acc), add(i3, acc);
        } else {
          const auto i0 = load(r, pack), i1 = load(r + step, pack);
          add(i0, acc), add(i1, acc);
        }
      }
      for (; r < rows; r += step) add(load(r, pack), acc);
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float v = acc[m][j];
#pragma unroll
        for (int o = 16; o >= 2; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (q == 0) red[((warp * 2 + half) * M + m) * N + j] = v;
      }
    __syncthreads();
    if (int(threadIdx.x) < 2 * M * N) {
      const int h = threadIdx.x / (M * N), mj = threadIdx.x % (M * N), p = 2 * u + h;
      if (p < n_packs) {
        float total = 0.0f;
        for (int w = 0; w < warps; ++w) total += red[(w * 2 + h) * M * N + mj];
        out(mj / N, int64_t(p) * N + mj % N, total);
      }
    }
    __syncthreads();
  }
}

// Phase 2 of the rms_norm backwards under Note [column dw]: dw = sum over rows of dy * x * r
// (fused: x the rounded x + residual), each term as phase 1 would have formed it; `rstd` [rows]
// was written by other blocks before the grid barrier (__ldcg), x and dy are inputs (read-only).
// Two rows in flight with the residual (four spilled at 64 registers).
template <class T, bool kFused>
__device__ __forceinline__ void rms_dw_by_columns(const BwdArgs<T>& a, const float* rstd, float* red, T* dw_out,
                                                  int64_t dw_stride) {
  constexpr int N = Pack<T>::n;
  struct Item {
    Pack<T> x, g;
    float r;
  };
  auto load = [&](int64_t row, int pack) {
    const BwdRow<T> p = bwd_row<T, kFused>(a, row);
    Item it;
    it.x = load_pack_readonly(p.x + int64_t(pack) * N);
    if constexpr (kFused) it.x = rounded_sum(it.x, load_pack_readonly(p.r + int64_t(pack) * N));
    it.g = load_pack_readonly(p.dy + int64_t(pack) * N);
    it.r = __ldcg(rstd + row);
    return it;
  };
  auto add = [](const Item& it, float (&acc)[1][N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[0][j] += to_f32(it.g.v[j]) * to_f32(it.x.v[j]) * it.r;
  };
  column_sums<T, 1, kFused ? 2 : 4>(a.rows, int(a.hidden / N), red, load, add,
                    [&](int, int64_t col, float total) { dw_out[col * dw_stride] = from_f32<T>(total); });
}

// Whether a one-launch backward takes Note [column dw]: where phase 2 would read again no more
// bytes (`reread`: rows x hidden x the tensors it needs) than the partial rows move (`partials`:
// G x hidden x the quantities summed, f32, written and read), within half the L2 cache, and with
// at least as many rows as SMs (fewer were not measured). The L2 of an H200 is not much faster
// than its DRAM, so the bytes decide (docs/perf/gpu-h200-2026-12-01-round35.md, bf16, partial
// rows against columns in one call): rms_norm_backward 133 x 1,000 5.4 -> 4.0 us, 300 x 4,104
// (the break-even point) 10.6 -> 10.1-10.7, layer_norm_backward 1,024 x 4,096 17.6 -> 17.5; past
// the rule the columns were slower (rms_norm_backward 1,024 x 4,096 13.5 -> 13.9, 2,400 x 2,048
// 15.2 -> 20.7). OPFORGE_CUDA_NORM_COLUMNS=0 keeps the partial rows, =2 takes the columns at any
// size (tuning, checks).
inline bool column_dw_pays(const CudaDeviceProps& props, int64_t rows, int64_t reread, int64_t partials) {
  static const bool off = env_off("OPFORGE_CUDA_NORM_COLUMNS");
  static const bool always = env_choice("OPFORGE_CUDA_NORM_COLUMNS", 2, 2) == 2;
  return !off && (always || (rows >= props.sm_count && reread <= partials && reread <= props.l2_bytes / 2));
}

// ---- bulk-copy row pipelines (Note [bulk-copy row pipeline], cuda_backward_bulk.cu) -----------------
// Stages of a ring, at most. Up to 6 (what two blocks of the bf16 rms_norm pipeline can hold)
// measured no faster at 16,384 x 4,096 on an H200 (110.2-110.7 against 112.5 us;
// docs/perf/gpu-h200-2026-11-28-round20.md).
inline constexpr int kBulkMaxStages = 4;
// Shared memory the runtime reserves per block (besides the kernel's static arrays), left out of
// a block's share.
inline constexpr int64_t kBlockReservedSmem = 1024;

// Note [row order]: the rows a block of a pipeline takes, `begin`, `begin + step`, ... below `end`.
// Strided (block b: b, b + G, b + 2G, ...) keeps the rows that all blocks read at one time within a
// window of about G rows, as a grid-stride copy does; chunked (block b: [b * C, (b + 1) * C))
// spreads them over the whole tensor. OPFORGE_CUDA_BULK_ROWS=chunked takes the chunks (tuning).
struct BlockRows {
  int64_t begin, end, step;
};
// `owners` blocks take rows (the first ones of the grid; all of it unless said otherwise).
__device__ __forceinline__ BlockRows block_rows(int64_t rows, int64_t rows_per_block, bool strided,
                                                int64_t owners = -1) {
  if (owners < 0) owners = gridDim.x;
  if (blockIdx.x >= owners) return {rows, rows, 1};
  if (strided) return {int64_t(blockIdx.x), rows, owners};
  const int64_t b = int64_t(blockIdx.x) * rows_per_block;
  return {b, min(rows, b + rows_per_block), 1};
}
inline bool bulk_rows_strided() {
  static const bool chunked = [] {
    const char* e = std::getenv("OPFORGE_CUDA_BULK_ROWS");
    return e && std::string_view(e) == "chunked";
  }();
  return !chunked;
}

// The 16-byte pack at `offset` bytes into a stage of a pipeline's ring.
template <class T>
__device__ __forceinline__ Pack<T> stage_pack(const unsigned char* stage, uint32_t offset) {
  return *reinterpret_cast<const Pack<T>*>(stage + offset);
}

// Thread 0 of a pipeline kernel: the bulk copies of one row of each of the M tensors `src` into
// the stage at `dst` (tensor m at m * row_bytes), completing on the stage's barrier.
template <class T, int M>
__device__ __forceinline__ void fill_stage(unsigned char* dst, uint64_t* bar, uint32_t row_bytes,
                                           const T* const (&src)[M]) {
  bulk_expect(bar, M * row_bytes);
#pragma unroll
  for (int m = 0; m < M; ++m) bulk_copy(dst + m * row_bytes, src[m], row_bytes, bar);
}

// Thread 0 of a pipeline kernel: the stages' barriers, then the block's first rows into them
// (issue(row, stage) copies one row; it skips rows past the block's). The caller's block barrier
// follows before anyone waits.
template <class Issue>
__device__ __forceinline__ void start_ring(uint64_t* full, int stages, const BlockRows& rows, Issue issue) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) bulk_barrier_init(&full[s]);
  for (int s = 0; s < stages; ++s) issue(rows.begin + s * rows.step, s);
}

// A pipeline kernel's launch: stages in a block's ring, its dynamic shared memory and the blocks
// resident on the device. Each kernel keeps one BulkCache (static): the dynamic shared-memory
// limit is raised once to the most a block can ask for, and the blocks that fit on an SM are
// cached per (block size, stages).
struct BulkPlan {
  int stages = 0;
  int64_t smem = 0, resident = 0;
};
struct BulkCache {
  std::atomic<bool> limit_set{false};
  std::atomic<int64_t> static_bytes{-1};  // the kernel's static shared memory
  std::atomic<int> per_sm[kBwdMaxThreads / 32 + 1][kBulkMaxStages + 1]{};
};
// `want_blocks` blocks of `block` threads share an SM's shared memory; a stage holds
// `stage_bytes`. False when fewer than two stages fit or no block does.
template <class Kernel>
bool plan_bulk(Kernel kernel, BulkCache& cache, const CudaDeviceProps& props, int64_t stage_bytes,
               int want_blocks, int block, BulkPlan& plan) {
  int64_t fixed = cache.static_bytes.load(std::memory_order_relaxed);
  if (fixed < 0) {
    cudaFuncAttributes attr{};
    OPFORGE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    fixed = int64_t(attr.sharedSizeBytes);
    cache.static_bytes.store(fixed, std::memory_order_relaxed);
  }
  const int64_t most = props.shared_per_block_optin - fixed;
  const int64_t share = std::min(props.shared_per_sm / want_blocks - fixed - kBlockReservedSmem, most);
  plan.stages = int(std::min<int64_t>(kBulkMaxStages, share / stage_bytes));
  if (plan.stages < 2) return false;
  plan.smem = plan.stages * stage_bytes;
  if (!cache.limit_set.load(std::memory_order_acquire)) {
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
    cache.limit_set.store(true, std::memory_order_release);
  }
  std::atomic<int>& slot = cache.per_sm[block / 32][plan.stages];
  int fit = slot.load(std::memory_order_relaxed);
  if (fit == 0) {
    OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, block, size_t(plan.smem)));
    if (fit < 1) return false;
    slot.store(fit, std::memory_order_relaxed);
  }
  plan.resident = int64_t(fit) * props.sm_count;
  return true;
}

// Rows per SM from which the pipelines are taken (below, a block has too few rows to fill its
// ring). OPFORGE_CUDA_BULK_MIN_ROWS_PER_SM (1..64, a power of two) overrides it (tuning).
inline int64_t bulk_min_rows_per_sm(int64_t fallback) {
  static const int forced = env_choice("OPFORGE_CUDA_BULK_MIN_ROWS_PER_SM", 1, 64);
  return forced ? forced : fallback;
}

// Note [held row]: a pipeline kernel that takes one row a turn (rms_norm's with the residual, or
// where its ring holds fewer than four stages; layer_norm's) may keep the row's values in registers
// from its sums to dx instead of reading the stage again: then every thread is done with the
// row's stage at the reduction's block barrier, and thread 0 refills that stage at once (`stages`
// rows ahead) rather than the previous row's, so a whole ring of rows is in flight while the row is
// written. layer_norm_backward holds d = x - c and dy in f32 (16 registers at one pack a thread:
// no conversions or shifts in the dx pass either), rms_norm's the turn's packs as loaded. Taken for
// bf16, where it measured faster; H200, 16,384 x 4,096, same binary, re-read / held, three rounds
// (docs/perf/gpu-h200-2026-12-01-round36.md): layer_norm_backward bf16 115.5-115.8 -> 112.4-112.6
// us (82.9% -> 85.2-85.8% of copy), but f16 113.3-113.6 -> 114.8-115.5; fused_add_rms_norm_backward
// bf16 1,024 x 4,096 16.6 -> 16.1, 16,384 unchanged (212.3-212.8 / 212.1). Row pairs do not hold:
// two rows' packs at the 64-register bound made the pair kernel slower (rms_norm_backward 106.7 ->
// 116.3). OPFORGE_CUDA_NORM_HOLD=0 re-reads everywhere, =2 holds in every 16-bit type (tuning).
template <class T> bool hold_row() {
  static const int forced = [] {
    const char* e = std::getenv("OPFORGE_CUDA_NORM_HOLD");
    return e ? std::atoi(e) : -1;
  }();
  if (forced == 0) return false;
  if (forced == 2) return sizeof(T) == 2;
  return std::is_same_v<T, __nv_bfloat16>;
}

// ---- few rows: one cluster (Note [few-row backward cluster], cuda_backward.cu) -------------------------
// ClusterPlan, bwd_cluster_plan: ops/norm/cluster_plan.h.

// Whether `kernel` may run in clusters of up to 16 CTAs (the non-portable sizes): false where the
// device refuses, or OPFORGE_CUDA_NORM_CLUSTER_CTAS=8 keeps the portable 8 (tuning). The caller
// asks once per kernel (static).
inline bool allow_wide_clusters(const void* kernel) {
  const char* e = std::getenv("OPFORGE_CUDA_NORM_CLUSTER_CTAS");
  if (e && std::string_view(e) == "8") return false;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) return true;
  cudaGetLastError();  // a refusal means "8 at most", not an error
  return false;
}
// The plan of a few-row cluster launch whose kernel for r rows a thread is kernels[r - 1]: up to
// 16 CTAs where `wide` and from 8 rows on, else (or where the device cannot co-schedule that
// cluster) up to 8; ranks 0 when neither applies or fits. H200, bf16, 16 against 8 CTAs in one
// call (docs/perf/gpu-h200-2026-11-28-round20.md): 16 x 4,096 rms_norm_backward 4.21 -> 3.50 us,
// fused_add_rms_norm_backward 4.75 -> 3.96, layer_norm_backward 5.53 -> 4.62; 9 x 4,104
// layer_norm_backward 5.28 -> 4.88; 16 x 8,192 5.85 -> 4.62 (rms); but one row 2.28 -> 2.47 (rms)
// and 2.73 -> 2.95 (layer_norm), where a CTA is one warp and the wider barrier costs more.
inline ClusterPlan fitting_cluster_plan(int device_index, int64_t rows, int64_t n_packs,
                                        const void* const (&kernels)[2], bool wide) {
  wide = wide && rows >= kWideClusterMinRows;
  for (const int most : {wide ? kClusterCtas : kClusterPortableCtas, kClusterPortableCtas}) {
    const ClusterPlan c = bwd_cluster_plan(rows, n_packs, most);
    if (c.ranks == 0) return c;
    if (cluster_launch_fits(device_index, kernels[c.rows_per_thread - 1], c.ranks, c.groups * c.padded, 0))
      return c;
  }
  return ClusterPlan{};
}

// V sums of every row over the cluster. cta_row_sums: each thread's sums of its RT rows (row
// g + s * groups in slot s) go through a warp reduce-scatter, then the warps of a row group in order,
// into `cta[row]` (this CTA's partial). After a cluster barrier, cluster_row_totals: thread
// t < rows * V adds sum t % V of row t / V over the CTAs in rank order through distributed shared memory into
// `total[t]`, so every CTA gets the same bits, and returns it (0 in the other threads: a caller
// may test a row's sums in registers, by shuffles within the warp, before the block barrier). The
// caller then arrives at the cluster barrier (done reading the others' `cta`) and syncs its block
// before reading `total`.
template <int V, int RT> struct ClusterRowSums {
  float warp[kClusterMaxThreads / 32][RT][V];
  float cta[kClusterMaxRows][V];
  float total[kClusterMaxRows][V];
};
template <int V, int RT>
__device__ __forceinline__ void cta_row_sums(float (&s)[RT][V], ClusterRowSums<V, RT>& sh, int groups, int padded,
                                             int64_t rows) {
  constexpr int G = 32 / V;  // Note [reduce-scatter block sum]: lane l ends with sum l / G of the warp
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const float t = warp_reduce_scatter<V>(s[r], lane);
    if (lane % G == 0) sh.warp[threadIdx.x / 32][r][lane / G] = t;
  }
  __syncthreads();
  // Thread t < rows: row t = group t % groups, slot t / groups; its group's warps in order.
  const int warps_per_group = padded / 32;
  if (int64_t(threadIdx.x) < rows && int(threadIdx.x) < groups * RT) {
    const int tg = threadIdx.x % groups, ts = threadIdx.x / groups;
    float acc[V] = {};
    for (int w = tg * warps_per_group; w < (tg + 1) * warps_per_group; ++w)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += sh.warp[w][ts][v];
#pragma unroll
    for (int v = 0; v < V; ++v) sh.cta[threadIdx.x][v] = acc[v];
  }
}
template <int V, int RT>
__device__ __forceinline__ float cluster_row_totals(cooperative_groups::cluster_group& cluster,
                                                    ClusterRowSums<V, RT>& sh, int groups, int64_t rows) {
  const unsigned ranks = cluster.num_blocks();
  const int64_t held = rows < int64_t(groups) * RT ? rows : int64_t(groups) * RT;
  float t = 0.0f;
  if (int64_t(threadIdx.x) < held * V) {  // thread t: sum t % V of row t / V
#pragma unroll
    for (int r0 = 0; r0 < kClusterCtas; r0 += kClusterPortableCtas) {  // 8 ranks at a time
      if (r0 >= int(ranks)) break;
      float parts[kClusterPortableCtas];
#pragma unroll
      for (int r = 0; r < kClusterPortableCtas; ++r)  // every remote load issued before the first is used
        if (r0 + r < int(ranks)) parts[r] = cluster.map_shared_rank(&sh.cta[0][0], unsigned(r0 + r))[threadIdx.x];
#pragma unroll
      for (int r = 0; r < kClusterPortableCtas; ++r)
        if (r0 + r < int(ranks)) t += parts[r];
    }
    (&sh.total[0][0])[threadIdx.x] = t;
  }
  return t;
}

// Column sums of a cluster CTA's columns over its row groups, for M quantities at once (dw, or dw
// and db): thread (g, p) holds in v[m][j] its sum of quantity m for column (pack p of the CTA,
// element j). One group: those are the totals. Else each thread stages its M x N sums as
// [group][m][j][pack] in `stage` (groups * padded * M * N floats, at most kClusterMaxThreads * N;
// consecutive threads, consecutive words), then thread t adds column (m, j, pack) =
// (t / padded / N, t / padded % N, t % padded) over the groups in order (padded x M x N columns
// summed in parallel, `groups` shared loads each: one barrier pair for all M). out(m, column,
// total) stores a total. Ends on a block barrier when it staged (the stage can be reused).
template <int M, int N, class Out>
__device__ __forceinline__ void cluster_column_sums(const float (&v)[M][N], float* stage, int g, int pl, int padded,
                                                    int packs, int groups, int first_pack, int n_packs,
                                                    Out out) {
  if (groups == 1) {
    if (pl < packs && first_pack + pl < n_packs)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int j = 0; j < N; ++j) out(m, (first_pack + pl) * N + j, v[m][j]);
    return;
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < N; ++j) stage[((g * M + m) * N + j) * padded + pl] = v[m][j];
  __syncthreads();
  for (int c = threadIdx.x; c < padded * M * N; c += blockDim.x) {
    const int mj = c / padded, cp = c % padded, cpack = first_pack + cp;
    if (cp >= packs || cpack >= n_packs) continue;
    float sum = 0.0f;
    for (int h = 0; h < groups; ++h) sum += stage[(h * M * N + mj) * padded + cp];
    out(mj / N, cpack * N + mj % N, sum);
  }
  __syncthreads();
}
// One quantity: out(column, total).
template <int N, class Out>
__device__ __forceinline__ void cluster_column_sums(const float (&v)[N], float* stage, int g, int pl, int padded,
                                                    int packs, int groups, int first_pack, int n_packs,
                                                    Out out) {
  cluster_column_sums(reinterpret_cast<const float(&)[1][N]>(v), stage, g, pl, padded, packs, groups, first_pack,
                      n_packs, [&](int, int column, float total) { out(column, total); });
}

// Note [bulk-copy row pipeline] (cuda_backward_bulk.cu): runs the many-row vec16 backward through
// shared memory filled by the copy engine; false when its stages do not fit (the caller then runs
// the register-resident kernel). Instantiated for float, half and bfloat16, fused or not.
template <class T, bool kFused>
bool launch_bwd_bulk(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw);

}  // namespace opforge::cuda::norm
