// Bandwidth-first CUDA kernels of layer_norm and layer_norm_backward (the math is the ops' docs and
// ops/layernorm/cuda.cu's header). They are registered above cuda_vec16 (ops/layernorm/cuda.cu),
// which stays as the fallback for the shapes their predicates reject.
//
// cuda_vec16_rowblock (layer_norm, priority 300).
//  - One small block per row, each thread holding K 16-byte packs of the row in registers
//    (pack i of the row in thread i % blockDim.x, slot i / blockDim.x), so x is read from DRAM
//    once and y written once: 2 * itemsize bytes per element, the minimum. K = 4 (bf16, f16) or
//    8 (f32), 32 elements a thread, for rows of at least 32 * K packs (hidden 4096: 128 threads
//    in every dtype), fewer for shorter rows so that a row still fills a warp; blockDim.x =
//    ceil(packs / K) rounded up to a warp.
//  - Why it is fast: cuda_vec16 gives a row 512 threads x 1 pack, so an SM holds 2-4 rows
//    (16-32 KB) in flight and its large blocks stall on 6 block barriers per row. Here a thread
//    issues all K loads back to back, an SM holds up to 8 rows (64 KB at hidden 4096 bf16, 64
//    registers a thread) in flight, and a row's reductions are a butterfly within a warp plus
//    one shared-memory step across 4 warps. The grid is one block per row (capped at the grid
//    limit, blocks loop): the block scheduler keeps every SM full and balances the tail without
//    a fixed row split; 16 rows are 16 blocks, one DRAM round trip.
//  - Statistics: one paired reduction of the sums of d = x - x[0] and of d^2 (Note [shifted
//    sums]) while the row's first element is near its mean; otherwise the mean from the row sum,
//    then the centred pass over the registers (sum of d = x - mean and of d^2, one paired
//    reduction) with the correction mean += sum(d) / n, var * n = sum(d^2) - sum(d)^2 / n. Either
//    way no E[x^2] - E[x]^2 cancellation.
//  - w and b are read per row from L1/L2 (__ldg), not DRAM: their 2 * hidden elements stay
//    cached across the rows of an SM. 16-bit packs widen and round by 32-bit words, and the bias
//    is a template argument (Note [word-wise packs]): no cached pack is split into 16-bit halves
//    and spilled.
//  - Predicate: f32/f16/bf16; hidden a multiple of the pack, at least 64 packs (shorter rows go
//    to cuda_vec16, which packs several rows into one block) and at most 32768; x and y rows
//    16-byte aligned (base and row stride); w (and b) contiguous and 16-byte aligned.
//
// cuda_vec16_async (layer_norm_backward, priority 300).
//  - A cooperative launch of G resident blocks (G from the SM count and the occupancy of this
//    kernel; with few rows, blocks without rows join only the dw/db reduction, about 8 threads per
//    column); block b owns the rows [b * C, (b + 1) * C), each thread K 16-byte packs of a row:
//    K = 1 up to 512 packs with at most 2,048 rows, else 1 below 512 packs and 2 from 512 on
//    (blockDim.x = packs / K rounded up to a warp, at most 512; hidden 4096: 512 threads bf16 at
//    few rows, 256 at many, 512 f32; at most 1024 packs, hidden 8192 bf16, 4096 f32).
//  - Note [async row pipeline]: x and dy of the next kStages - 1 rows are copied to shared memory
//    with cp.async (16 bytes a pack, LDGSTS) while the current row is reduced and written, so
//    every block keeps (kStages - 1) * 2 rows of loads in flight through its reductions without
//    spending registers on them (the register-resident kernel held only the current row and
//    reached about half of the copy bandwidth). Each thread copies and later reads back only its
//    own 16 bytes, so its own cp.async.wait_group orders them (no barrier), and it refills a slot
//    only after it has used the values it read from it.
//  - From a row per SM on, the same ring is filled by bulk copies instead (Note [bulk copies] in
//    cuda_launch.cuh; kBulkStages rows in flight): thread 0 copies each tensor's whole row, which
//    lands where the threads' own 16-byte copies would, every thread waits on the stage's
//    mbarrier, and thread 0 refills the stage after the row's first reduction (whose barrier
//    follows every thread's reads of it). Measured faster from 1,024 rows on (f32 16,384 x 4,096
//    on an H200: 85% -> 91% of copy; bf16 59% -> 60%, where the row's two reductions and its
//    arithmetic, not the loads in flight, bound the kernel).
//  - A handful of rows (up to 16, at most two a thread of one cluster) goes to one
//    thread-block cluster instead (Note [few-row layer_norm backward cluster],
//    cuda_backward_cluster.cu; bf16 16 x 4,096 on an H200: 6.8 -> 4.14 us, 1 x 4,096 6.2 -> 2.51).
//  - From 4 rows an SM on the call goes instead to the bulk-copy pipeline with one reduction a row
//    (Note [layer_norm backward in one reduction], cuda_backward_bulk.cu; bf16 16,384 x 4,096:
//    162 -> 149 us), except f32 from 16 rows an SM on, which stays here (212 against 224 us).
//  - Statistics about the f32 mean of the first reduction, Note [backward centring]
//    (cuda_backward.cuh).
//  - dw and db (Note [deterministic dw] in ops/norm/cuda_backward.cu): each thread sums its
//    columns' dy * xhat and dy over the block's rows in f32 registers, the block writes one row
//    of partials [G, 2 * hidden] to the per-stream workspace, a grid barrier (Note [grid barrier]),
//    then block b sums its slice of the 2 * hidden columns over the G partials in a fixed order
//    and rounds once (Note [one-launch dw] in ops/norm/cuda_backward.cu). No float atomics: the
//    bits depend only on the inputs, the SM count and this kernel's occupancy.
//  - Bytes: x, dy read once, dx written once (3 * itemsize per element) plus the partials
//    (G * 2 * hidden floats written and read back, mostly from L2).
//  - Predicate: f32/f16/bf16; hidden a multiple of the pack and at most 1024 packs; dx, dy, x rows
//    16-byte aligned (base and row stride); w contiguous and 16-byte aligned.
//
// Both: f32 arithmetic, int64 row offsets (row * row_stride), launches on ctx.stream (the forward
// programmatic: Note [programmatic launch] in cuda_launch.cuh), no host
// synchronization; the backward's workspace is allocated only on the first call with a larger
// shape. y may alias x exactly in the forward: every element is read into registers by the thread
// that later writes it. The backward outputs overlap no input (its check).
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <type_traits>

#include "ops/layernorm/cuda_backward.cuh"

namespace opforge {
namespace cuda::layernorm_fast {
namespace {

using norm::reduce_partials;
using norm::row_stride_of;

constexpr int kMaxThreads = 1024;
// Forward: at most 32 elements a thread (K = 4 packs of bf16/f16, 8 of f32): the f32 copies of a
// row slice fit the 64 registers of a 1024-thread launch bound (at 8 bf16 packs, 64 elements, the
// kernel spilled 232 bytes a thread).
template <class T> constexpr int fwd_max_k() { return 32 / Pack<T>::n; }
constexpr int kFwdMinPacks = 64;  // shorter rows: cuda_vec16 (rows share a block)
constexpr int kStages = 3;        // Note [async row pipeline]
constexpr int kBulkStages = 4;    // the same ring filled by bulk copies (Note [bulk copies])

template <class T> struct FwdArgs {
  T* y;
  const T* x;
  const T* w;
  const T* b;  // nullptr: no bias
  int64_t y_stride, x_stride;  // row strides in elements
  int64_t rows, hidden;
  float eps;
};

// Sums of V values over the block (blockDim.x a multiple of 32, at most 1024): a butterfly within
// each warp, then, with more than one warp, the warp results go through shared memory and are
// added in a fixed order: by every thread in warp order for up to 8 warps, else by a second
// butterfly over the warp results (2 instructions per value per thread instead of 2 per warp).
// Every thread gets the same bits (Note [cuda reductions]). `scratch` holds V * 32 floats and is
// not written again by this call; the caller alternates two scratch arrays (see the kernels).
template <int V> __device__ __forceinline__ void team_sum(float (&v)[V], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = group_sum<32>(v[i]);
  if (n_warps == 1) return;  // block-uniform
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < V; ++i) scratch[i * 32 + warp] = v[i];
  __syncthreads();
  if (n_warps <= 8) {  // block-uniform
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float s = 0.0f;
      for (int w = 0; w < n_warps; ++w) s += scratch[i * 32 + w];
      v[i] = s;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = group_sum<32>(lane < n_warps ? scratch[i * 32 + lane] : 0.0f);
  }
}

// ---- forward ---------------------------------------------------------------------------------------
// Sums of d = x - c and of d^2 over the thread's packs of the row (pack i = t + k * threads).
template <class T, int K>
__device__ __forceinline__ void sums_about(const Pack<T> (&xp)[K], int t, int threads, int n_packs, float c,
                                           float (&cs)[2]) {
  cs[0] = cs[1] = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (t + k * threads < n_packs) {
      const PackFloats<T> f = widen_pack(xp[k]);
#pragma unroll
      for (int j = 0; j < Pack<T>::n; ++j) {
        const float d = f.v[j] - c;
        cs[0] += d;
        cs[1] += d * d;
      }
    }
}

// Note [shifted sums]: the row's sums of d = x - x[0] and of d^2 in one block reduction give the
// mean and the centred sum of squares M2 = sum d^2 - (sum d)^2 / n. Its rounding error relative
// to M2 grows with n (mean - x[0])^2 / M2, the cancellation; while that is at most 8 (x[0] within
// about 3 standard deviations of the mean, as in any row not built against it) the answer is as
// accurate as the centred form and one reduction is saved. Otherwise (an outlier first element,
// a row of mean 100 and spread 1 whose first element is far out) the kernel takes the centred
// form: the sum, then the sums of x - mean, two more reductions. The test is on the reduced sums,
// so the whole block takes the same branch. OPFORGE_CUDA_LN_SHIFTED=0 always takes the centred
// form (tuning).
template <class T, int K, bool kShifted, bool kBias>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_rowblock_kernel(FwdArgs<T> a) {
  constexpr int N = Pack<T>::n;
  __shared__ float scratch_sum[32];
  __shared__ float scratch_centred[2 * 32];
  // By row parity: a warp can reach the next row's reduction while another still reads this one's.
  __shared__ float scratch_shifted[2][2 * 32];
  int parity = 0;
  const int n_packs = int(a.hidden / N);
  const int t = threadIdx.x, threads = blockDim.x;
  const float inv_h = 1.0f / float(a.hidden);
  programmatic_prologue();  // Note [programmatic launch]
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {  // block-uniform
    const T* x = a.x + row * a.x_stride;
    Pack<T> xp[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = t + k * threads;
      if (i < n_packs) xp[k] = load_pack(x + int64_t(i) * N);
    }
    float mean, centred_sq;
    bool done = false;
    if constexpr (kShifted) {  // Note [shifted sums]
      const float s0 = to_f32(x[0]);
      float cs[2];  // sum d, sum d^2 with d = x - x[0]
      sums_about(xp, t, threads, n_packs, s0, cs);
      team_sum<2>(cs, scratch_shifted[parity]);
      parity ^= 1;
      const float md = cs[0] * inv_h, m2 = cs[1] - cs[0] * md;
      mean = s0 + md;
      centred_sq = m2;
      done = cs[0] * md <= 8.0f * m2;  // block-uniform: every thread has the same sums
    }
    if (!done) {
      float sum[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (t + k * threads < n_packs) {
          const PackFloats<T> f = widen_pack(xp[k]);
#pragma unroll
          for (int j = 0; j < N; ++j) sum[0] += f.v[j];
        }
      team_sum<1>(sum, scratch_sum);
      mean = sum[0] * inv_h;
      float cs[2];  // sum d, sum d^2 with d = x - mean
      sums_about(xp, t, threads, n_packs, mean, cs);
      team_sum<2>(cs, scratch_centred);
      const float shift = cs[0] * inv_h;
      mean += shift;
      centred_sq = cs[1] - cs[0] * shift;
    }
    const float rstd = rstd_of<T>(fmaxf(centred_sq, 0.0f), a.hidden, a.eps);
    T* y = a.y + row * a.y_stride;
    // Note [word-wise packs]: for 16-bit types x, w and b widen by 32-bit words (widen_pack), the
    // output rounds by pairs (narrow_pack) and the bias is a template argument (kBias) rather
    // than a test per pack. That took the bf16 kernel from 73 to 67.5 us at 16,384 x 4,096
    // (88% -> 95% of copy) and from 6.0 to 5.3 us at 1,024 tokens on an H200, f16 from 67.5 to
    // 67.0 and 5.25 to 5.1 (docs/perf/gpu-h200-2026-11-28-round17.md). f32 keeps a test per pack
    // (launched with kBias false): as a template argument its K = 8 kernel spilled and ran 5-10%
    // slower (133 -> 140 us).
    constexpr bool kWordPacks = !std::is_same_v<T, float>;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = t + k * threads;
      if (i >= n_packs) continue;
      if constexpr (kWordPacks) {
        PackFloats<T> f = widen_pack(xp[k]);
        const PackFloats<T> wf = widen_pack(load_pack_readonly(a.w + int64_t(i) * N));
        PackFloats<T> bf{};
        if constexpr (kBias) bf = widen_pack(load_pack_readonly(a.b + int64_t(i) * N));
        // Two FMAs an element: xhat = x * rstd - mean * rstd, y = xhat * w + b. Rounding
        // mean * rstd adds an error of the order of the mean's own rounding over the spread, far
        // below a 16-bit output's step; 1-3% faster at 1,024 tokens than (x - mean) * rstd * w + b.
        const float shift = -mean * rstd;
#pragma unroll
        for (int j = 0; j < N; ++j) f.v[j] = fmaf(fmaf(f.v[j], rstd, shift), wf.v[j], bf.v[j]);
        store_pack(y + int64_t(i) * N, narrow_pack(f));
      } else {
        const Pack<T> wp = load_pack_readonly(a.w + int64_t(i) * N);
        Pack<T> bp;
        if (a.b) bp = load_pack_readonly(a.b + int64_t(i) * N);
        Pack<T> out;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float bias = a.b ? to_f32(bp.v[j]) : 0.0f;
          out.v[j] = from_f32<T>((to_f32(xp[k].v[j]) - mean) * rstd * to_f32(wp.v[j]) + bias);
        }
        store_pack(y + int64_t(i) * N, out);
      }
    }
    // No barrier before the next row: the two reductions use separate scratch arrays, and a
    // thread can write one of them again only after passing the other's barrier, which every
    // thread reaches after reading it.
  }
}

// K for a row of n_packs: the largest of max_k, ..., 2, 1 that still leaves a full warp of packs.
int fwd_k(int64_t n_packs, int max_k) {
  int k = max_k;
  while (k > 1 && n_packs < int64_t(32) * k) k /= 2;
  return k;
}

template <class T, int K> void launch_fwd_k(const Context& ctx, const FwdArgs<T>& a, int64_t n_packs) {
  static const bool centred_only = env_off("OPFORGE_CUDA_LN_SHIFTED");
  const int threads = int((n_packs + K - 1) / K + 31) / 32 * 32;
  auto pick = [&](auto bias) {
    constexpr bool kB = decltype(bias)::value;
    return centred_only ? layer_norm_rowblock_kernel<T, K, false, kB> : layer_norm_rowblock_kernel<T, K, true, kB>;
  };
  auto* kernel = pick(std::false_type{});
  if constexpr (!std::is_same_v<T, float>)  // Note [word-wise packs]: f32 tests for the bias per pack
    if (a.b) kernel = pick(std::true_type{});
  launch_programmatic(ctx, "layer_norm_cuda_vec16_rowblock kernel launch", kernel, dim3(grid_for(a.rows, 1)),
                      dim3(threads), 0, a);
}

template <class T> void launch_forward(const Context& ctx, const FwdArgs<T>& a) {
  const int64_t n_packs = a.hidden / Pack<T>::n;
  switch (fwd_k(n_packs, fwd_max_k<T>())) {
    case 8: launch_fwd_k<T, fwd_max_k<T>() == 8 ? 8 : 4>(ctx, a, n_packs); break;
    case 4: launch_fwd_k<T, 4>(ctx, a, n_packs); break;
    case 2: launch_fwd_k<T, 2>(ctx, a, n_packs); break;
    default: launch_fwd_k<T, 1>(ctx, a, n_packs); break;
  }
  check_launch("layer_norm_cuda_vec16_rowblock kernel launch");
}

// ---- backward ------------------------------------------------------------------------------------
// Stages of the backward kernel's ring: kStages with cp.async, kBulkStages with bulk copies.
template <bool kBulk> constexpr int bwd_stages() { return kBulk ? kBulkStages : kStages; }
// Shared memory of the backward kernel: `stages` stages, each x then dy, K packs a thread.
__host__ __device__ constexpr int64_t bwd_smem_bytes(int stages, int threads, int k) {
  return int64_t(stages) * 2 * k * threads * 16;
}

// K packs a thread (pack i of a row in thread i % blockDim.x, slot i / blockDim.x): 1 for rows
// of fewer than 512 packs, else 2 (blockDim.x at most 512: the 32 f32 dw/db accumulators of a
// bf16 thread need more than the 64 registers of a 1024-thread bound). Two packs halve the warps
// a row's reductions run on (hidden 4096 bf16: 8 warps instead of 16), the instructions that do
// not scale with the row.
template <class T, int K, bool kBulk>
__global__ void __launch_bounds__(K == 1 ? kMaxThreads : kMaxThreads / 2)
    layer_norm_bwd_async_kernel(BwdArgs<T> a, float* partial, int64_t rows_per_block, bool strided,
                                int64_t parts, unsigned* barrier, T* dw_out, int64_t dw_stride, T* db_out,
                                int64_t db_stride) {
  constexpr int N = Pack<T>::n;
  extern __shared__ __align__(16) unsigned char stage_mem[];
  __shared__ float scratch_sum[32];
  __shared__ float scratch_rest[4 * 32];
  __shared__ float slice[kMaxThreads];
  __shared__ uint64_t full[kBulkStages];  // Note [bulk copies]: one barrier a stage
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int S = bwd_stages<kBulk>();
  const int n_packs = int(a.hidden / N);
  const int t = threadIdx.x, threads = blockDim.x;
  const float inv_h = 1.0f / float(a.hidden);
  // This thread's k-th 16 bytes of x (tensor 0) and dy (tensor 1) in stage s.
  auto slot = [&](int s, int tensor, int k) {
    return stage_mem + ((int64_t(2 * s + tensor) * K + k) * threads + t) * 16;
  };
  auto active = [&](int k) { return t + k * threads < n_packs; };

  Pack<T> wp[K];
  float dw[K][N], db[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (active(k)) wp[k] = load_pack_readonly(a.w + int64_t(t + k * threads) * N);
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = db[k][j] = 0.0f;
  }

  // Note [row order] (ops/norm/cuda_backward.cuh): the first `parts` blocks own rows.
  const norm::BlockRows rows = norm::block_rows(a.rows, rows_per_block, strided, parts);
  const int64_t first = rows.begin, last = rows.end, step = rows.step;
  // Bulk: thread 0 copies the whole rows; the packs land where the threads' own copies would.
  const unsigned row_bytes = unsigned(a.hidden) * unsigned(sizeof(T));
  auto issue_bulk = [&](int64_t row, int s) {
    if (row >= last) return;
    bulk_expect(&full[s], 2 * row_bytes);
    bulk_copy(slot(s, 0, 0) - t * 16, a.x + row * a.x_stride, row_bytes, &full[s]);
    bulk_copy(slot(s, 1, 0) - t * 16, a.dy + row * a.dy_stride, row_bytes, &full[s]);
  };
  auto issue = [&](int64_t row, int s) {  // one commit group per call, empty past the chunk
    if (row < last)
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (active(k)) {
          const int64_t col = int64_t(t + k * threads) * N;
          cp_async16(slot(s, 0, k), a.x + row * a.x_stride + col);
          cp_async16(slot(s, 1, k), a.dy + row * a.dy_stride + col);
        }
    cp_async_commit();
  };
  if constexpr (kBulk) {
    norm::start_ring(full, S, rows, issue_bulk);
    __syncthreads();  // the barriers are initialised before anyone waits on them
  } else {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(first + s * step, s);
  }

  int stage = 0;
  unsigned parity = 0;
  for (int64_t row = first; row < last; row += step) {  // block-uniform
    if constexpr (kBulk) {
      bulk_wait(&full[stage], parity);
    } else {
      // Refill the stage that the previous row read: each thread refills only its own slots,
      // whose values it has already used.
      issue(row + (S - 1) * step, stage == 0 ? S - 1 : stage - 1);
      cp_async_wait<S - 1>();  // this row's group is complete
    }
    Pack<T> xp[K], gp[K];
    float sum[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (active(k)) {
        xp[k] = *reinterpret_cast<const Pack<T>*>(slot(stage, 0, k));
        gp[k] = *reinterpret_cast<const Pack<T>*>(slot(stage, 1, k));
#pragma unroll
        for (int j = 0; j < N; ++j) sum[0] += to_f32(xp[k].v[j]);
      }
    team_sum<1>(sum, scratch_sum);
    if constexpr (kBulk) {  // every thread has read the stage (the reduction's barrier): refill it
      if (threads == 32) __syncwarp();  // a one-warp team_sum has no block barrier
      if (t == 0) issue_bulk(row + S * step, stage);
    }
    const float mean0 = sum[0] * inv_h;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // sum d, sum d^2, sum g, sum g * d; g = dy * w
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (active(k))
#pragma unroll
        for (int j = 0; j < N; ++j)
          add_row_sums(s, to_f32(xp[k].v[j]) - mean0, to_f32(gp[k].v[j]) * to_f32(wp[k].v[j]));
    team_sum<4>(s, scratch_rest);
    const CentredRow st = centred_row(s, inv_h);  // Note [backward centring] (cuda_backward.cuh)
    const float rstd = rstd_of<T>(st.m2, a.hidden, a.eps);
    const float mean_g = s[2] * inv_h;
    const float mean_gx = st.gd * rstd * inv_h;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (active(k)) {
        Pack<T> out;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xhat = ((to_f32(xp[k].v[j]) - mean0) - st.shift) * rstd;
          const float gy = to_f32(gp[k].v[j]);
          out.v[j] = from_f32<T>(rstd * (gy * to_f32(wp[k].v[j]) - mean_g - xhat * mean_gx));
          dw[k][j] += gy * xhat;
          db[k][j] += gy;
        }
        store_pack(a.dx + row * a.dx_stride + int64_t(t + k * threads) * N, out);
      }
    // No barrier before the next row: the two reductions alternate their scratch arrays (as in
    // the forward), and a stage is refilled by the thread that read it, after using what it read.
    if (++stage == S) stage = 0, parity ^= 1u;
  }
  if constexpr (!kBulk) cp_async_wait<0>();  // nothing left in flight (groups past the chunk are empty)

  float* dw_part = partial + int64_t(blockIdx.x) * 2 * a.hidden;
  float* db_part = dw_part + a.hidden;
  if (blockIdx.x < parts)  // the blocks past `parts` own no rows and only reduce
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (active(k)) {
        const int64_t col = int64_t(t + k * threads) * N;
#pragma unroll
        for (int j = 0; j < N; j += 4) {
          *reinterpret_cast<float4*>(dw_part + col + j) =
              make_float4(dw[k][j], dw[k][j + 1], dw[k][j + 2], dw[k][j + 3]);
          *reinterpret_cast<float4*>(db_part + col + j) =
              make_float4(db[k][j], db[k][j + 1], db[k][j + 2], db[k][j + 3]);
        }
      }

  grid_barrier(barrier, gridDim.x);

  // dw and db together: 2 * hidden columns of the `parts` partial rows (the blocks past `parts`
  // only reduce).
  reduce_partials(partial, parts, 2 * a.hidden, slice, [&](int64_t col, float total) {
    if (col < a.hidden) dw_out[col * dw_stride] = from_f32<T>(total);
    else db_out[(col - a.hidden) * db_stride] = from_f32<T>(total);
  });
}

template <class T, int K, bool kBulk>
void launch_backward_k(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw,
                       const TensorView& db) {
  auto kernel = layer_norm_bwd_async_kernel<T, K, kBulk>;
  constexpr int S = bwd_stages<kBulk>();
  const int64_t n_packs = a.hidden / Pack<T>::n;
  const int threads = int(((n_packs + K - 1) / K + 31) / 32 * 32);
  const int64_t smem = bwd_smem_bytes(S, threads, K);
  // Per instantiation: the dynamic shared memory allowed, set once to the most any block size
  // needs (so no later call lowers it), and per block size the blocks that fit on an SM (a
  // cooperative launch of more blocks than fit is refused).
  static std::atomic<int> per_sm[kMaxThreads / 32 + 1];
  static std::atomic<bool> smem_allowed{false};
  if (!smem_allowed.load(std::memory_order_acquire)) {
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(bwd_smem_bytes(S, kMaxThreads, 1))));
    smem_allowed.store(true, std::memory_order_release);
  }
  int fit = per_sm[threads / 32].load(std::memory_order_relaxed);
  if (fit == 0) {
    OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, threads, smem));
    if (fit < 1)
      throw Error(ErrorCode::internal,
                  "layer_norm_backward_cuda_vec16_async: no block fits on an SM");
    per_sm[threads / 32].store(fit, std::memory_order_relaxed);
  }
  const int64_t resident = int64_t(fit) * cuda_device_props(ctx.device.index).sm_count;
  // `parts` blocks own rows (no rows: block 0 writes a zero partial, so dw = db = 0); with few
  // rows more blocks join the column reduction, about 8 threads per column.
  int64_t parts = 1, rows_per_block = 0;
  if (a.rows > 0) {
    rows_per_block = (a.rows + resident - 1) / resident;
    parts = (a.rows + rows_per_block - 1) / rows_per_block;
  }
  const int64_t reducers = std::min(resident, (2 * a.hidden * 8 + threads - 1) / threads);
  const int64_t blocks = std::max(parts, reducers);
  auto* partial =
      static_cast<float*>(cuda_workspace(ctx, parts * 2 * a.hidden * int64_t(sizeof(float))));
  unsigned* barrier = cuda_grid_barrier(ctx);
  launch_cooperative(ctx, "layer_norm_backward_cuda_vec16_async cooperative launch", kernel, blocks,
                     threads, size_t(smem), a, partial, rows_per_block, norm::bulk_rows_strided(), parts,
                     barrier, dw.ptr<T>(),
                     int64_t(dw.stride(0)), db.ptr<T>(), int64_t(db.stride(0)));
}

template <class T>
void launch_backward(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw,
                     const TensorView& db) {
  // Packs a thread: 1 up to 512 packs a row while the rows are few (up to 2,048), else 2 from 512
  // packs on. H200, bf16 hidden 4,096 (512 packs), K = 1 / 2: 1 row 6.29 / 6.55 us, 16 rows 6.77 /
  // 8.80, 1,024 rows 22.3 / 24.7, 16,384 rows 179.9 / 165.1; 1,024 packs (bf16 8,192, f32 4,096)
  // took 2 at every size measured (docs/perf/gpu-h200-2026-11-27-round15.md). Tuning runs force
  // K with OPFORGE_CUDA_LN_BWD_K (1 or 2).
  const int64_t n_packs = a.hidden / Pack<T>::n;
  static const int forced = env_choice("OPFORGE_CUDA_LN_BWD_K", 1, 2);
  int k = n_packs < 512 || (n_packs == 512 && a.rows <= 2048) ? 1 : 2;
  if (forced) k = forced;
  if (k == 1 && n_packs > kMaxThreads) k = 2;
  // Bulk copies fill the ring from a row per SM on (H200, bf16 4,096: 16,384 rows 165 -> 162 us,
  // 1,024 rows 22.4 -> 21.7, f32 16,384 rows 228 -> 212); at 16 rows the cp.async form stays
  // (6.07 against 6.20 us in f32). OPFORGE_CUDA_LN_BULK=0 keeps cp.async throughout.
  // From 4 rows an SM on (f32: 4 to 16): the bulk-copy pipeline with one reduction a row (Note
  // [layer_norm backward in one reduction], cuda_backward_bulk.cu).
  // Few rows: one thread-block cluster (Note [few-row layer_norm backward cluster]).
  if (launch_bwd_cluster<T>(ctx, a, dw, db)) return;
  if (launch_bwd_rows<T>(ctx, a, dw, db)) return;
  static const bool bulk_on = !env_off("OPFORGE_CUDA_LN_BULK");
  if (bulk_on && a.rows >= cuda_device_props(ctx.device.index).sm_count) {
    if (k == 2) launch_backward_k<T, 2, true>(ctx, a, dw, db);
    else launch_backward_k<T, 1, true>(ctx, a, dw, db);
  } else {
    if (k == 2) launch_backward_k<T, 2, false>(ctx, a, dw, db);
    else launch_backward_k<T, 1, false>(ctx, a, dw, db);
  }
}

// ---- predicates ------------------------------------------------------------------------------------
const char* vector_pack_problem(const TensorView& v, const char* not_contiguous,
                                const char* not_aligned) {
  if (v.stride(0) != 1 && v.size(0) > 1) return not_contiguous;
  if (!aligned16(v.data)) return not_aligned;
  return nullptr;
}

const char* packs_problem(std::initializer_list<const TensorView*> rows, const TensorView& x,
                          const TensorView& w, const TensorView* b, int64_t min_packs,
                          int64_t max_packs, const char* too_long) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();
  const int64_t hidden = x.size(-1);
  if (hidden % n != 0) return n == 8 ? "hidden % 8 != 0" : "hidden % 4 != 0";
  if (hidden / n < min_packs)
    return min_packs == kFwdMinPacks ? "row shorter than 64 packs (cuda_vec16 shares blocks)"
                                     : "empty rows";
  if (hidden / n > max_packs) return too_long;
  if (const char* why = vector_pack_problem(w, "w is not contiguous", "w is not 16-byte aligned"))
    return why;
  if (b && b->defined())
    if (const char* why = vector_pack_problem(*b, "b is not contiguous", "b is not 16-byte aligned"))
      return why;
  for (const TensorView* r : rows)
    if (const char* why = pack_rows_problem(*r, hidden)) return why;
  return nullptr;
}

}  // namespace
}  // namespace cuda::layernorm_fast

void layer_norm_cuda_vec16_rowblock(const Context& ctx, const TensorView& y, const TensorView& x,
                                    const TensorView& w, const TensorView& b, double eps) {
  namespace lf = cuda::layernorm_fast;
  if (x.rows() == 0 || x.size(-1) == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  cuda::dispatch_float(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    lf::FwdArgs<T> a{};
    a.y = y.ptr<T>(), a.y_stride = lf::row_stride_of(y);
    a.x = x.ptr<T>(), a.x_stride = lf::row_stride_of(x);
    a.w = w.ptr<T>();
    if (b.defined()) a.b = b.ptr<T>();
    a.rows = x.rows();
    a.hidden = x.size(-1);
    a.eps = float(eps);
    lf::launch_forward<T>(ctx, a);
  });
}
const char* layer_norm_cuda_vec16_rowblock_applicable(const TensorView& y, const TensorView& x,
                                                      const TensorView& w, const TensorView& b,
                                                      double) {
  namespace lf = cuda::layernorm_fast;
  // One block a row: with fewer rows than an H100 / H200 has SMs most of the card idles, and
  // cuda_vec16 (more threads a row) is faster there. H200, 2026-11-26, bf16 hidden 4096: 16 rows
  // 4.5 us here against 3.0 us, 1024 rows 6.7 us against 9.2 us.
  constexpr int64_t kMinRows = 128;
  if (x.rows() < kMinRows) return "fewer than 128 rows (cuda_vec16 is faster at few rows)";
  // 32 elements a thread, 1024 threads: hidden 32768 in every dtype.
  const int64_t max_packs = int64_t(32 / (16 / std::max<int64_t>(x.itemsize(), 1))) * lf::kMaxThreads;
  return lf::packs_problem({&y, &x}, x, w, &b, lf::kFwdMinPacks, max_packs,
                           "hidden longer than 32768 (32 elements x 1024 threads)");
}

void layer_norm_backward_cuda_vec16_async(const Context& ctx, const TensorView& dx,
                                          const TensorView& dw, const TensorView& db,
                                          const TensorView& dy, const TensorView& x,
                                          const TensorView& w, double eps) {
  namespace lf = cuda::layernorm_fast;
  if (x.size(-1) == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  cuda::dispatch_float(x.dtype, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    lf::BwdArgs<T> a{};
    a.dx = dx.ptr<T>(), a.dx_stride = lf::row_stride_of(dx);
    a.dy = dy.ptr<T>(), a.dy_stride = lf::row_stride_of(dy);
    a.x = x.ptr<T>(), a.x_stride = lf::row_stride_of(x);
    a.w = w.ptr<T>();
    a.rows = x.rows();
    a.hidden = x.size(-1);
    a.eps = float(eps);
    lf::launch_backward<T>(ctx, a, dw, db);
  });
}
const char* layer_norm_backward_cuda_vec16_async_applicable(const TensorView& dx,
                                                            const TensorView&, const TensorView&,
                                                            const TensorView& dy,
                                                            const TensorView& x,
                                                            const TensorView& w, double) {
  namespace lf = cuda::layernorm_fast;
  return lf::packs_problem({&dx, &dy, &x}, x, w, nullptr, 1, lf::kMaxThreads,
                           "row longer than 1024 packs (one pack a thread)");
}

void register_layernorm_cuda_fast(Registry& reg) {
  reg.add_kernel<LayerNorm>(
      cuda_kernel_desc("cuda_vec16_rowblock", 300,
                       "one small block per row, 8 16-byte packs a thread in registers (x read "
                       "once), centred f32 statistics, many rows in flight per SM",
                       true),
      &layer_norm_cuda_vec16_rowblock, &layer_norm_cuda_vec16_rowblock_applicable);
  // f32 dw / db tolerance as the other layer_norm_backward CUDA kernels (cuda.cu).
  KernelDesc bwd = cuda_kernel_desc(
      "cuda_vec16_async", 300,
      "x and dy streamed into a ring of shared-memory stages (cp.async, or bulk copies with "
      "one reduction a row from 4 rows an SM); one cooperative launch with per-block f32 dw/db "
      "partials reduced in fixed order after a grid barrier; a handful of rows in one "
      "thread-block cluster (row sums through distributed shared memory)",
      false);
  bwd.tolerances[DType::f32] = Tolerance{1e-4, 1e-4, 1e-10};
  reg.add_kernel<LayerNormBackward>(std::move(bwd), &layer_norm_backward_cuda_vec16_async,
                                    &layer_norm_backward_cuda_vec16_async_applicable);
}

}  // namespace opforge
