// CUDA kernels of cross_entropy_with_grad: cross_entropy and its backward in one call (math: the
// ops' docs, ops/loss/loss.h).
//
// Technique. Separately, cross_entropy reads the [N, V] logits once and cross_entropy_backward
// reads them again and writes dlogits: three passes over N x V elements. The fused op needs two,
// one read and one write, which is the floor: 4.2 GB at 8,192 x 128,256 bf16, about 1.0 ms at an
// H200's 4.25 TB/s copy rate (the two ops took 0.593 + 1.689 ms there).
//  - Note [ce with grad clusters] (the plan: ops/loss/loss_cuda.h). A row is too long for one
//    CTA's shared memory (a 128,256-entry bf16 row is 256 KB; a CTA gets at most 227 KB), so a
//    thread-block cluster of `cluster` CTAs (sm_90) holds it: each CTA copies its slice of the row
//    from HBM into its shared memory (16-byte cp.async, every copy of the slice in flight at once:
//    no registers held, no loop of dependent loads), takes the slice's (max, sum of exp(z - max),
//    sum z) from shared memory, and leaves them in shared memory. After cluster.sync() thread 0 of
//    every CTA reads the cluster's partials through distributed shared memory in rank order and
//    merges them (every CTA gets the same bits), so every CTA knows the row's lse; the CTA of rank
//    0 writes lse and the row's loss. Then every CTA writes its slice's dlogits from its shared
//    copy: HBM sees one read of the logits and one write of dlogits. The cluster size is the
//    smallest that leaves three CTAs on an SM (a slice of at most a third of the SM's shared
//    memory: at 128,256 bf16, 4 CTAs of 62.6 KB; f32, 7 of 71.6 KB), so one CTA's copy-in overlaps
//    another's arithmetic and a third's stores. OPFORGE_CE_GRAD_CLUSTER=1..8 forces a size.
//  - Note [ce with grad, exp once]: without a softcap, the packed kernel keeps each element's
//    exp(z - max) in shared memory in place of z, so the gradient is one FFMA an element.
//  - Note [ce with grad, few rows]: up to 64 rows the plan's clusters leave most SMs idle (16 rows
//    of 32,000 bf16: 16 CTAs) and the launches around the kernel cost more than its traffic. There
//    the clusters take up to 8 CTAs, as many as fill the SMs (plan_for); a mean's kept rows are
//    counted by every CTA (one target a thread, __syncthreads_count) instead of by a launch before
//    it; and sum / mean's row losses are added by the rank-0 CTA of the last row to arrive (Note
//    [last block]) instead of by a launch after it: one launch in all. Few short rows without
//    options still run faster as the two kernels (two_passes_faster), and take them.
//    OPFORGE_CE_GRAD_FEW_ROWS=0 turns all this off (side-by-side timing).
//  - A CTA's threads own fixed units of the slice (unit u of thread t: u = t + k * 256) for the
//    copy, the statistics and the gradient, so each thread reads back only what it copied itself:
//    cp.async.wait_all (wait_group per quarter in the exp-once kernel) orders that, and no block
//    barrier is needed before the statistics.
//  - Reductions in a fixed order (warp butterflies, warps in order: ops/softmax/row_reduce.cuh,
//    then the cluster's ranks in order): deterministic for a given cluster size. f32 statistics,
//    exp per Note [element exp], accurate logf / tanhf, 64-bit offsets (row * row_stride).
//  - The gradient is cross_entropy_backward's: dz = g ((1 + 2 s lse) p - eps - (1 - ls) [j ==
//    target]) times the softcap's derivative, the target entry computed in f32 like every other
//    (from the unrounded lse, which the separate ops read back as f32: the same value).
//  - Upstream gradient on the device: g = dloss[row] (none), dloss[0] (sum), dloss[0] / kept rows
//    (mean: a one-block launch counts the kept rows into the workspace first, as
//    cross_entropy_backward does; few rows: each CTA counts). sum / mean: the per-row losses go to
//    the workspace and Note [loss row reduction] adds them in one more launch (few rows: in the
//    same launch). No host synchronization anywhere.
//  - cuda_cluster_vec16 (priority 300): 16-byte packs, needs aligned bases, V and row strides
//    multiples of the pack for logits and dlogits; cuda_cluster (200): single elements (plain
//    loads staged through registers, four in flight a thread), any layout; cuda (100):
//    cross_entropy's and cross_entropy_backward's kernels one after the other, for rows longer
//    than a cluster's shared memory (over 1.8 MB) or devices without clusters. The cluster
//    kernels' predicates name what rules them out (compute capability < 9.0, the row's length);
//    a device that cannot co-schedule the cluster (cudaOccupancyMaxActiveClusters = 0, e.g. a
//    small MIG slice) runs the two-kernel path from inside the cluster impl.
// Like cross_entropy's kernels, a target outside [0, V) other than ignore_index cannot be reported
// without a host synchronization: that row's loss and gradient are NaN.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"
#include "ops/softmax/row_reduce.cuh"

namespace opforge {
namespace cuda::loss {
namespace {

namespace cg = cooperative_groups;
using namespace cuda::rows;  // NOLINT: UnitOf, Stats, add_unit, exp_shifted, merge_all, row_stats, row_sum

constexpr int kThreads = 256;    // threads of a CTA
constexpr int kMaxCluster = 8;   // the portable cluster size limit
constexpr int kStageBatch = 4;   // single-element staging: loads in flight a thread

enum class Red { none, sum, mean };
Red red_of(std::string_view r) { return r == "none" ? Red::none : r == "sum" ? Red::sum : Red::mean; }

__device__ __forceinline__ float cap(float x, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
}

// TOut: the gradient's dtype, T's except for f32 logits of a 16-bit model
// (fused_linear_cross_entropy_with_grad's token blocks, ce_grad_rows below).
template <class T, class TOut = T> struct FusedArgs {
  const T* logits;
  int64_t logits_stride;
  TOut* dlogits;
  int64_t dlogits_stride;
  int64_t rows, vocab;
  const int64_t* target;
  int64_t target_stride;
  const void* dloss;
  DType dloss_dtype;
  int64_t dloss_stride;  // 0 for sum / mean (one element)
  const float* kept;     // mean: the count of kept rows (workspace); else null
  float* loss;           // [rows] (none) or the workspace (sum / mean)
  int64_t loss_stride;
  float* lse;
  int64_t lse_stride;
  int64_t ignore_index;
  float smoothing, z_scale, softcap;
  // Note [ce with grad, few rows]: mean's kept rows counted by every CTA (kept null), and sum /
  // mean's row losses added by the last row to arrive on `arrivals` (reduce.out non-null).
  bool count_in_block = false;
  unsigned* arrivals = nullptr;
  RowReduce reduce{};
};

// The row statistics a CTA leaves for its cluster.
struct Partial {
  float m, s, sum_z;
};


// One unit (a pack or an element) of logits into the statistics: softcap, sum z, online max/sum.
// kPlain: no softcap and no label smoothing (then neither is looked at).
template <class T, bool kVec, bool kPlain>
__device__ __forceinline__ void consume(const typename UnitOf<T, kVec>::Raw& raw, float softcap, Stats& st,
                                        float& sum_z) {
  typename UnitOf<T, kVec>::Floats z = UnitOf<T, kVec>::widen(raw);
  if constexpr (!kPlain) {
#pragma unroll
    for (int j = 0; j < UnitOf<T, kVec>::width; ++j) {
      z.v[j] = cap(z.v[j], softcap);
      sum_z += z.v[j];
    }
  }
  st = add_unit<T>(st, z.v);
}

// Copies this thread's units of the slice (n units from `src`) into shared memory `dst` and
// accumulates their statistics. Packs: cp.async, all in flight, then read back from shared memory.
// Elements: plain loads, kStageBatch in flight, stored to shared memory and consumed from registers.
template <class T, bool kVec, bool kPlain>
__device__ __forceinline__ void stage_slice(const T* src, T* dst, int64_t n, float softcap, Stats& st,
                                            float& sum_z) {
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  const int64_t tid = threadIdx.x;
  if constexpr (kVec) {
    for (int64_t u = tid; u < n; u += kThreads) cp_async16(dst + u * W, src + u * W);
    cp_async_wait_all();
    for (int64_t u = tid; u < n; u += kThreads) consume<T, kVec, kPlain>(U::load(dst + u * W), softcap, st, sum_z);
  } else {
    int64_t u = tid;
    for (; u + (kStageBatch - 1) * kThreads < n; u += kStageBatch * kThreads) {
      T raw[kStageBatch];
#pragma unroll
      for (int k = 0; k < kStageBatch; ++k) raw[k] = src[u + k * kThreads];
#pragma unroll
      for (int k = 0; k < kStageBatch; ++k) {
        dst[u + k * kThreads] = raw[k];
        consume<T, kVec, kPlain>(raw[k], softcap, st, sum_z);
      }
    }
    for (; u < n; u += kThreads) {
      const T raw = src[u];
      dst[u] = raw;
      consume<T, kVec, kPlain>(raw, softcap, st, sum_z);
    }
  }
}

// dz of one element: g ((1 + 2 s lse) p - eps - (1 - ls) [target]) = gs p + gb (gb folds in the
// target's term for the target entry), times the softcap's derivative 1 - (z / c)^2.
template <class T, bool kPlain>
__device__ __forceinline__ float grad_of(float x, float lse, float lse2, float gs, float gb, float softcap,
                                         float inv_softcap) {
  const float z = kPlain ? x : cap(x, softcap);
  float dz = fmaf(gs, exp_shifted<T>(z, lse, lse2), gb);
  if (!kPlain && softcap > 0.0f) {
    const float r = z * inv_softcap;
    dz *= 1.0f - r * r;
  }
  return dz;
}

// A row's place in the grid and the scalars its CTAs need, read first so their latency overlaps
// the copies. Grid x: clusters of consecutive CTAs, one a row; grid y: rows beyond 2^31 CTAs. A
// target out of range makes g NaN, so the whole row's gradient is NaN.
struct RowScalars {
  int64_t row, t;
  unsigned rank;
  bool ignored, writer;  // writer: rank 0, thread 0 writes the row's lse and loss
  bool kept_mine;        // count_in_block: whether row threadIdx.x exists and is kept
  float kept_count;      // count_in_block: the kept rows (count_kept); else -1
  float zt, g;           // z[target] (writer only) and the upstream gradient
};
template <class P>
__device__ __forceinline__ RowScalars row_scalars(const P& p, float softcap) {
  const cg::cluster_group cluster = cg::this_cluster();
  RowScalars r;
  r.rank = cluster.block_rank();
  const unsigned ranks = cluster.num_blocks();
  r.row = int64_t(blockIdx.y) * (gridDim.x / ranks) + blockIdx.x / ranks;
  r.t = 0, r.ignored = true, r.writer = false, r.kept_mine = false, r.kept_count = -1.0f, r.zt = 0.0f, r.g = 0.0f;
  if (r.row >= p.rows) return r;
  if (p.count_in_block)  // loaded now, counted after the row's statistics (count_kept)
    r.kept_mine = threadIdx.x < p.rows && p.target[int64_t(threadIdx.x) * p.target_stride] != p.ignore_index;
  r.t = p.target[r.row * p.target_stride];
  r.ignored = r.t == p.ignore_index;
  const bool bad = !r.ignored && (r.t < 0 || r.t >= p.vocab);
  r.writer = r.rank == 0 && threadIdx.x == 0;
  if (r.writer && !r.ignored) r.zt = bad ? NAN : cap(to_f32(p.logits[r.row * p.logits_stride + r.t]), softcap);
  if (!r.ignored) {
    r.g = load_float(p.dloss, p.dloss_dtype, r.row * p.dloss_stride);
    if (p.kept) r.g /= *p.kept;
    if (bad) r.g = NAN;
  }
  return r;
}

// Note [ce with grad, few rows]: the upstream gradient of a mean divided by the kept rows counted
// in this CTA (every thread takes part: a barrier), from the targets row_scalars loaded.
template <class P> __device__ __forceinline__ void count_kept(const P& p, RowScalars& r) {
  if (!p.count_in_block) return;  // uniform over the launch
  r.kept_count = float(__syncthreads_count(r.kept_mine));
  if (!r.ignored) r.g /= r.kept_count;
}

// Note [ce with grad, few rows]: sum / mean's row losses added in this launch by the rank-0 CTA of
// the last row to arrive (Note [last block]); every thread of every CTA calls it.
template <class P> __device__ __forceinline__ void reduce_if_last(const P& p, const RowScalars& r) {
  if (p.reduce.out == nullptr || r.rank != 0) return;  // uniform over the CTA
  if (last_block_arrives(p.arrivals, unsigned(p.rows))) reduce_rows_in_block<kThreads>(p.reduce, r.kept_count);
}

// The cluster's half of a row (every thread of every CTA calls it, once the block's statistics
// are in `mine`): publishes them in `partial`, then thread 0 of each CTA reads the cluster's
// partials through distributed shared memory in rank order and merges them (every CTA gets the
// same bits); the writer stores the row's lse and loss. Returns the row's lse to every thread.
// Ends with this CTA's arrive on the cluster barrier: the kernel's closing cluster_wait() keeps
// `partial` alive until every CTA has read it.
template <class P>
__device__ __forceinline__ float cluster_row_lse(const P& p, const RowScalars& r, Partial mine,
                                                 Partial& partial, float& row_lse, float smoothing) {
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned ranks = cluster.num_blocks();
  if (threadIdx.x == 0) partial = mine;
  cluster.sync();
  if (threadIdx.x == 0) {
    Partial all[kMaxCluster];
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k)  // every remote load issued before the first is used
      if (k < int(ranks)) all[k] = *cluster.map_shared_rank(&partial, unsigned(k));
    Stats sts[kMaxCluster];
    float total_z = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k)
      if (k < int(ranks)) {
        sts[k] = Stats{all[k].m, all[k].s};
        total_z += all[k].sum_z;
      }
    const Stats total = merge_all(sts, int(ranks));  // Note [max first]
    const float lse = total.m + logf(total.s);
    row_lse = lse;
    if (r.writer) {
      p.lse[r.row * p.lse_stride] = lse;
      float loss = 0.0f;
      if (!r.ignored) {
        const float eps = smoothing / float(p.vocab);
        loss = (1.0f - smoothing) * (lse - r.zt) + p.z_scale * lse * lse;
        if (smoothing > 0.0f) loss += smoothing * lse - eps * total_z;  // as cross_entropy's finish_row
      }
      p.loss[r.row * p.loss_stride] = loss;
    }
  }
  cluster_arrive();  // this CTA is done with the other CTAs' shared memory
  __syncthreads();   // row_lse
  return row_lse;
}

// The gradient's affine form dz = gs p + gb for one row (gb_target at the target entry), and where
// the target falls in this CTA's slice of n units of W elements starting at unit `begin`
// (t_unit -1: another CTA's).
struct GradForm {
  float gs, gb, gb_target;
  int64_t t_unit;
  int t_lane;
};
__device__ __forceinline__ GradForm grad_form(const RowScalars& r, float lse, float z_scale, float smoothing,
                                              int64_t vocab, int64_t begin, int64_t n, int W) {
  GradForm f;
  const float eps = smoothing / float(vocab);
  f.gs = r.g * (1.0f + 2.0f * z_scale * lse);
  f.gb = -r.g * eps, f.gb_target = -r.g * (eps + (1.0f - smoothing));
  const int64_t t_local = r.t - begin * W;
  f.t_unit = t_local >= 0 && t_local < n * W ? t_local / W : -1;
  f.t_lane = int(t_local - f.t_unit * W);
  return f;
}

// One CTA of a row's cluster (Note [ce with grad clusters]), CTA rank r owning units [r *
// slice_units, (r + 1) * slice_units) of the row. kPlain: softcap 0 and label_smoothing 0 (the
// training default), which leaves out the softcap's branches and the sum of z. Takes every layout
// (single elements) and the softcap; with_grad_once_kernel takes packs without a softcap.
template <class T, bool kVec, bool kPlain>
__global__ void __launch_bounds__(kThreads, 3) with_grad_cluster_kernel(FusedArgs<T> p, int64_t slice_units) {
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ Stats stats_scratch[kThreads / 32];
  __shared__ float sum_scratch[kThreads / 32];
  __shared__ Partial partial;  // this CTA's statistics, read by every CTA of the cluster
  __shared__ float row_lse;
  programmatic_prologue();  // Note [programmatic launch]
  const float softcap = kPlain ? 0.0f : p.softcap, smoothing = kPlain ? 0.0f : p.smoothing;
  RowScalars r = row_scalars(p, softcap);
  if (r.row >= p.rows) return;  // the whole cluster: its CTAs share the row
  const int64_t units = p.vocab / W;
  const int64_t begin = int64_t(r.rank) * slice_units;
  const int64_t n = max(int64_t(0), min(units, begin + slice_units) - begin);
  T* slice = reinterpret_cast<T*>(smem_raw);

  Stats st{-INFINITY, 0.0f};
  float sum_z = 0.0f;
  stage_slice<T, kVec, kPlain>(p.logits + r.row * p.logits_stride + begin * W, slice, n, softcap, st, sum_z);
  st = row_stats<T>(st, kThreads, stats_scratch);
  if (smoothing > 0.0f) sum_z = row_sum(sum_z, kThreads, sum_scratch);
  const float lse = cluster_row_lse(p, r, Partial{st.m, st.s, sum_z}, partial, row_lse, smoothing);
  const float lse2 = lse * kLog2e;
  count_kept(p, r);

  T* out = p.dlogits + r.row * p.dlogits_stride + begin * W;
  typename U::Floats d;
  if (r.ignored) {
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = 0.0f;
    for (int64_t u = threadIdx.x; u < n; u += kThreads) U::store(out + u * W, d);
  } else {
    const GradForm f = grad_form(r, lse, p.z_scale, smoothing, p.vocab, begin, n, W);
    const float inv_softcap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
    for (int64_t u = threadIdx.x; u < n; u += kThreads) {
      const typename U::Floats xs = U::widen(U::load(slice + u * W));
#pragma unroll
      for (int j = 0; j < W; ++j) d.v[j] = grad_of<T, kPlain>(xs.v[j], lse, lse2, f.gs, f.gb, softcap, inv_softcap);
      if (u == f.t_unit) {  // once a row: the target entry, in f32 like every other
#pragma unroll
        for (int j = 0; j < W; ++j)
          if (j == f.t_lane)
            d.v[j] = grad_of<T, kPlain>(xs.v[j], lse, lse2, f.gs, f.gb_target, softcap, inv_softcap);
      }
      U::store(out + u * W, d);
    }
  }
  reduce_if_last(p, r);
  cluster_wait();  // no CTA leaves while another may still read its `partial`
}

// Note [ce with grad, exp once]: the packed kernel without a softcap (cuda_cluster_vec16's kernel
// for every call but a softcapped one) takes each element's exp once. A thread's units arrive in
// kStages commit groups (the slice in quarters), and the thread works on a quarter as soon as it
// has landed, while the rest is still in flight. Per quarter: its max (a packed 16-bit max, or
// f32), then e = exp(z - max) of every element, summed and written over the logits in shared
// memory (f16 for 16-bit inputs, f32 for f32). The quarters' (max, sum) partials merge into the
// thread's (Note [max first]), the thread's into the block's and the cluster's as before. Then
// dz = gs exp(z - lse) + gb = (gs exp(max_q - lse)) e + gb: one FFMA per element with one
// coefficient per quarter, where with_grad_cluster_kernel takes a second exp. The exps were half
// of the special-function unit's work (16 results a clock an SM against 128 FFMAs; Nsight Compute
// on an H200 had that pipe at 44% of its peak over the two-exp kernel, issue slots at 65%).
// Rounding: e is rounded to f16 (relative 2^-12) before the product is rounded to bf16 / f16;
// values below f16's normal range (e < 6.1e-5, so |dz| < 6.1e-5 gs) keep an absolute error under
// 3e-8 gs. Measured (H200, 8,192 x 128,256 bf16): 1.485 -> 1.364 ms, and 1.297 ms with the
// gradient's streaming stores (Note [streaming stores]); 8 commit groups (1.645 ms), four CTAs an
// SM in clusters of 5 (1.397 ms), an evict-first hint on the copies (1.383 ms) and the cluster's
// partials pushed into every CTA's shared memory before the barrier instead of read after it
// (1.413 ms) were slower.
constexpr int kStages = 4;

template <class T> __device__ __forceinline__ float unit_max(const Pack<T>& raw) {
  if constexpr (std::is_same_v<T, float>) {
    return fmaxf(fmaxf(raw.v[0], raw.v[1]), fmaxf(raw.v[2], raw.v[3]));
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2 w[4];
    __builtin_memcpy(w, &raw, sizeof(w));
    const T2 m = __hmax2(__hmax2(w[0], w[1]), __hmax2(w[2], w[3]));  // max of two non-NaN halves: fmax's rule
    return fmaxf(to_f32(m.x), to_f32(m.y));
  }
}
template <class T> __device__ __forceinline__ void store_exps(T* at, const float (&e)[Pack<T>::n]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(at) = make_float4(e[0], e[1], e[2], e[3]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(e[2 * i], e[2 * i + 1]);
      __builtin_memcpy(&w[i], &h, sizeof(h));
    }
    *reinterpret_cast<uint4*>(at) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
template <class T> __device__ __forceinline__ void load_exps(const T* at, float (&e)[Pack<T>::n]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 v = *reinterpret_cast<const float4*>(at);
    e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(at);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      __builtin_memcpy(&h, &w[i], sizeof(h));
      const float2 f = __half22float2(h);
      e[2 * i] = f.x, e[2 * i + 1] = f.y;
    }
  }
}
// Stage s of kSt has landed: at most kSt - 1 - s commit groups still in flight (s is a constant
// once the caller's loop is unrolled, so the chain folds to one wait).
template <int kSt> __device__ __forceinline__ void wait_stage(int s) {
  if constexpr (kSt == 1) {
    cp_async_wait<0>();
  } else {
    if (s == 0) cp_async_wait<kSt - 1>();
    else wait_stage<kSt - 1>(s - 1);
  }
}

// One pack of gradients: 16 bytes, or 8 where f32 logits give a 16-bit gradient; streaming stores
// (Note [streaming stores]): the gradient is never read again here.
template <class T, class TOut> __device__ __forceinline__ void store_grad(TOut* at, const PackFloats<T>& d) {
  if constexpr (std::is_same_v<T, TOut>) {
    store_pack_streaming(at, narrow_pack(d));
  } else {
    static_assert(std::is_same_v<T, float> && sizeof(TOut) == 2, "f32 logits, 16-bit gradient");
    TOut h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = from_f32<TOut>(d.v[j]);
    uint2 w;
    __builtin_memcpy(&w, h, sizeof(w));
    __stcs(reinterpret_cast<uint2*>(at), w);
  }
}

template <class T, class TOut>
__global__ void __launch_bounds__(kThreads, 3) with_grad_once_kernel(FusedArgs<T, TOut> p, int64_t slice_units) {
  constexpr int W = Pack<T>::n;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ Stats stats_scratch[kThreads / 32];
  __shared__ float sum_scratch[kThreads / 32];
  __shared__ Partial partial;
  __shared__ float row_lse;
  programmatic_prologue();  // Note [programmatic launch]
  const float smoothing = p.smoothing;
  RowScalars r = row_scalars(p, 0.0f);
  if (r.row >= p.rows) return;
  const int64_t units = p.vocab / W;
  const int64_t begin = int64_t(r.rank) * slice_units;
  const int64_t n = max(int64_t(0), min(units, begin + slice_units) - begin);
  T* slice = reinterpret_cast<T*>(smem_raw);
  const T* x = p.logits + r.row * p.logits_stride + begin * W;
  // Unit k of this thread is u = threadIdx.x + k * kThreads; stage s holds k in [s * per, (s + 1) * per).
  const int64_t mine = n > int64_t(threadIdx.x) ? (n - 1 - threadIdx.x) / kThreads + 1 : 0;
  const int64_t per = ((n + kThreads - 1) / kThreads + kStages - 1) / kStages;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    for (int64_t k = s * per; k < min(mine, (s + 1) * per); ++k) {
      const int64_t u = threadIdx.x + k * kThreads;
      cp_async16(slice + u * W, x + u * W);
    }
    cp_async_commit();
  }
  Stats part[kStages];
  float sum_z = 0.0f;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    wait_stage<kStages>(s);
    const int64_t k0 = s * per, k1 = min(mine, (s + 1) * per);
    float m = -INFINITY;
    for (int64_t k = k0; k < k1; ++k) {
      const Pack<T> raw = load_pack(slice + (threadIdx.x + k * kThreads) * W);
      m = fmaxf(m, unit_max(raw));
      if (smoothing > 0.0f) {
        const PackFloats<T> z = widen_pack(raw);
#pragma unroll
        for (int j = 0; j < W; ++j) sum_z += z.v[j];
      }
    }
    const float shift = m == -INFINITY ? 0.0f : m, shift2 = shift * kLog2e;
    float sum = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      T* at = slice + (threadIdx.x + k * kThreads) * W;
      const PackFloats<T> z = widen_pack(load_pack(at));
      float e[W];
#pragma unroll
      for (int j = 0; j < W; ++j) {
        e[j] = exp_shifted<T>(z.v[j], shift, shift2);
        sum += e[j];
      }
      store_exps(at, e);
    }
    part[s] = Stats{m, sum};
  }
  Stats st = merge_all<T>(part, kStages);
  st = row_stats<T>(st, kThreads, stats_scratch);
  if (smoothing > 0.0f) sum_z = row_sum(sum_z, kThreads, sum_scratch);
  const float lse = cluster_row_lse(p, r, Partial{st.m, st.s, sum_z}, partial, row_lse, smoothing);
  count_kept(p, r);

  TOut* out = p.dlogits + r.row * p.dlogits_stride + begin * W;
  if (r.ignored) {
    PackFloats<T> d;
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = 0.0f;
    for (int64_t k = 0; k < mine; ++k) store_grad<T, TOut>(out + (threadIdx.x + k * kThreads) * W, d);
  } else {
    const GradForm f = grad_form(r, lse, p.z_scale, smoothing, p.vocab, begin, n, W);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      // gs exp(max_s - lse); a stage of no units or only -inf has max -inf: coefficient 0.
      const float a = part[s].m == -INFINITY ? 0.0f : f.gs * expf(part[s].m - lse);
      const int64_t k1 = min(mine, (s + 1) * per);
      for (int64_t k = s * per; k < k1; ++k) {
        const int64_t u = threadIdx.x + k * kThreads;
        float e[W];
        load_exps(slice + u * W, e);
        PackFloats<T> d;
#pragma unroll
        for (int j = 0; j < W; ++j) d.v[j] = fmaf(a, e[j], f.gb);
        if (u == f.t_unit) {  // once a row
#pragma unroll
          for (int j = 0; j < W; ++j)
            if (j == f.t_lane) d.v[j] = fmaf(a, e[j], f.gb_target);
        }
        store_grad<T, TOut>(out + u * W, d);
      }
    }
  }
  reduce_if_last(p, r);
  cluster_wait();
}

// A launch of kThreads-thread CTAs in clusters of plan.cluster with plan.smem_bytes each.
struct ClusterLaunch {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t config{};
  ClusterLaunch(const CeGradClusterPlan& plan, dim3 grid, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(plan.cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(kThreads));
    config.dynamicSmemBytes = size_t(plan.smem_bytes);
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into attr
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether `kernel` can run clusters of plan.cluster CTAs with plan.smem_bytes each on the device
// (cudaOccupancyMaxActiveClusters > 0), asked once per (device, kernel, cluster, bytes). The first
// question per (device, kernel) also raises its dynamic shared memory limit to `budget_bytes`
// (smem_budget, which bounds every plan), so every later launch of it may use any plan's bytes, and
// asks for the largest shared memory carveout.
bool cluster_fits(int device, const void* kernel, const CeGradClusterPlan& plan, int64_t budget_bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int64_t>, bool> known;
  static std::map<std::pair<int, const void*>, bool> raised;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, plan.cluster, plan.smem_bytes);
  if (auto it = known.find(key); it != known.end()) return it->second;
  if (!raised[{device, kernel}]) {
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget_bytes)));
    // All of L1 as shared memory (the copies bypass L1): three CTAs of ~64 KB need ~195 KB of it.
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            int(cudaSharedmemCarveoutMaxShared)));
    raised[{device, kernel}] = true;
  }
  ClusterLaunch launch(plan, dim3(unsigned(plan.cluster)), nullptr);
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
  if (status != cudaSuccess) cudaGetLastError();  // a refusal means "does not fit", not an error
  return known[key] = status == cudaSuccess && clusters > 0;
}

int forced_cluster() {
  static const int forced = [] {
    const char* e = std::getenv("OPFORGE_CE_GRAD_CLUSTER");
    return e ? std::clamp(std::atoi(e), 0, kMaxCluster) : 0;
  }();
  return forced;
}

// A CTA's dynamic shared memory at most: the opt-in limit less a margin for the kernel's static
// arrays (dynamic + static may not exceed the limit).
constexpr int64_t kSmemMargin = 2048;
int64_t smem_budget(const CudaDeviceProps& props) { return props.shared_per_block_optin - kSmemMargin; }

// Note [ce with grad, few rows]: the rules are ce_grad_few_row_cluster and
// ce_grad_two_passes_faster (ops/loss/loss_cuda.h); OPFORGE_CE_GRAD_FEW_ROWS=0 turns both off.
bool few_rows(int64_t rows) {
  static const bool off = env_off("OPFORGE_CE_GRAD_FEW_ROWS");
  return !off && rows > 0 && rows <= kCeGradFewRows;
}

// Few short rows without a softcap or label smoothing run faster as cross_entropy's few-row
// cluster kernel then cross_entropy_backward's streaming kernel than as this file's one-read
// cluster kernel, whose fixed costs (staging through shared memory, the cluster barrier, the last
// row's reduction) outweigh the second read there. H200, bf16, us, two kernels / one-read cluster:
// 16 x 4,096 4.10 / 5.25, 24 x 20,000 4.77 / 5.88, 12 x 5,000 6.15 / 6.82, 16 x 32,000 7.53 /
// 7.91; but 16 x 128,256 10.41 / 10.26 and 16 x 32,000 with every option 12.01 / 9.62
// (docs/perf/gpu-h200-2026-11-30-round32.md). A forced cluster size keeps the cluster kernel.
bool two_passes_faster(int64_t rows, int64_t vocab, double label_smoothing, double softcap) {
  return few_rows(rows) && forced_cluster() == 0 && ce_grad_two_passes_faster(rows, vocab, label_smoothing, softcap);
}

// The plan for a call: three CTAs an SM when the slices allow (a third of the SM's shared memory
// less the 1 KiB the system keeps per CTA and the kernel's static arrays), at most smem_budget;
// with few rows (Note [ce with grad, few rows]) clusters of up to 8 CTAs, as many as leave no SM
// without a CTA (16 rows: 8 CTAs a row rather than 1 at 32,000 bf16, 4 at 128,256).
CeGradClusterPlan plan_for(const TensorView& logits, bool vec) {
  const CudaDeviceProps& props = cuda_device_props(logits.device.index);
  const int64_t unit = vec ? 16 / logits.itemsize() : 1;
  auto plan_of = [&](int forced) {
    return ce_grad_cluster_plan(logits.size(1), logits.itemsize(), unit, props.cc_major, smem_budget(props),
                                props.shared_per_sm / 3 - kSmemMargin, forced);
  };
  CeGradClusterPlan plan = plan_of(forced_cluster());
  const int64_t rows = logits.size(0);
  if (plan.cluster > 0 && forced_cluster() == 0 && few_rows(rows)) {
    const int fill = ce_grad_few_row_cluster(rows, props.sm_count, plan.cluster);
    if (fill > plan.cluster) {
      const CeGradClusterPlan wider = plan_of(fill);
      if (wider.cluster == fill) plan = wider;
    }
  }
  return plan;
}

// cross_entropy then cross_entropy_backward (their vec16 kernels when the layouts allow), reading
// the lse just written: the `cuda` impl, and the cluster impls' way out on a device that cannot
// co-schedule the cluster.
void two_passes(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
                const TensorView& logits, const TensorView& target, const TensorView& dloss, int64_t ignore_index,
                double label_smoothing, double lse_square_scale, double softcap, std::string_view reduction) {
  const bool vec_fwd = cuda::pack_rows_problem(logits, logits.size(1)) == nullptr;
  const bool vec_bwd = vec_fwd && cuda::pack_rows_problem(dlogits, dlogits.size(1)) == nullptr;
  (vec_fwd ? cross_entropy_cuda_vec16 : cross_entropy_cuda)(ctx, loss, lse, logits, target, ignore_index,
                                                            label_smoothing, lse_square_scale, softcap, reduction);
  (vec_bwd ? cross_entropy_backward_cuda_vec16 : cross_entropy_backward_cuda)(
      ctx, dlogits, dloss, logits, target, lse, ignore_index, label_smoothing, lse_square_scale, softcap, reduction);
}

template <bool kVec>
void with_grad(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
               const TensorView& logits, const TensorView& target, const TensorView& dloss, int64_t ignore_index,
               double label_smoothing, double lse_square_scale, double softcap, std::string_view reduction) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  auto fallback = [&] {
    two_passes(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
               softcap, reduction);
  };
  if (rows == 0 || vocab == 0) return fallback();  // nothing to read: the two kernels' edge handling
  DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = plan_for(logits, kVec);
  if (plan.cluster == 0) return fallback();  // the predicate has said why; reached only by direct calls
  if (two_passes_faster(rows, vocab, label_smoothing, softcap)) return fallback();
  const Red red = red_of(reduction);
  const int64_t budget = smem_budget(cuda_device_props(ctx.device.index));
  dispatch_float(logits.dtype, "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    // Packs without a softcap: Note [ce with grad, exp once]; the element kernel's kPlain form for
    // the training default (no softcap, no label smoothing).
    void (*kernel)(FusedArgs<T>, int64_t) = nullptr;
    if constexpr (kVec)
      kernel = softcap == 0.0 ? &with_grad_once_kernel<T, T> : &with_grad_cluster_kernel<T, true, false>;
    else
      kernel = softcap == 0.0 && label_smoothing == 0.0 ? &with_grad_cluster_kernel<T, false, true>
                                                        : &with_grad_cluster_kernel<T, false, false>;
    if (!cluster_fits(ctx.device.index, reinterpret_cast<const void*>(kernel), plan, budget)) return fallback();
    // Workspace: the kept-row count (mean, unless counted in the CTAs), then the per-row losses
    // (sum / mean).
    const bool few = few_rows(rows);
    const int64_t count_bytes = red == Red::mean && !few ? 16 : 0;
    const int64_t loss_bytes = red == Red::none ? 0 : rows * int64_t(sizeof(float));
    char* ws = count_bytes + loss_bytes > 0 ? static_cast<char*>(cuda_workspace(ctx, count_bytes + loss_bytes)) : nullptr;
    float* kept = count_bytes > 0 ? reinterpret_cast<float*>(ws) : nullptr;
    float* per_row = red == Red::none ? loss.ptr<float>() : reinterpret_cast<float*>(ws + count_bytes);
    if (kept) {
      RowReduce r;
      r.rows = rows, r.labels = target.ptr<int64_t>(), r.labels_stride = stride0(target);
      r.ignore_index = ignore_index, r.divide = true, r.count_only = true, r.out = kept;
      launch_row_reduce(ctx, r, "cross_entropy_with_grad count launch");
    }
    FusedArgs<T> p{};
    p.logits = logits.ptr<T>(), p.logits_stride = row_stride_of(logits);
    p.dlogits = dlogits.ptr<T>(), p.dlogits_stride = row_stride_of(dlogits);
    p.rows = rows, p.vocab = vocab;
    p.target = target.ptr<int64_t>(), p.target_stride = stride0(target);
    p.dloss = dloss.data, p.dloss_dtype = dloss.dtype, p.dloss_stride = red == Red::none ? stride0(dloss) : 0;
    p.kept = kept;
    p.loss = per_row, p.loss_stride = red == Red::none ? stride0(loss) : 1;
    p.lse = lse.ptr<float>(), p.lse_stride = stride0(lse);
    p.ignore_index = ignore_index;
    p.smoothing = float(label_smoothing), p.z_scale = float(lse_square_scale), p.softcap = float(softcap);
    RowReduce reduce;
    if (red != Red::none) {
      reduce.losses = per_row, reduce.rows = rows, reduce.labels = target.ptr<int64_t>();
      reduce.labels_stride = stride0(target), reduce.ignore_index = ignore_index, reduce.divide = red == Red::mean;
      reduce.out = loss.ptr<float>();
    }
    if (few) {  // Note [ce with grad, few rows]
      p.count_in_block = red == Red::mean;
      if (red != Red::none) p.arrivals = cuda_grid_barrier(ctx), p.reduce = reduce;
    }
    const int64_t slice_units = plan.slice / UnitOf<T, kVec>::width;
    const int64_t clusters_x = std::min<int64_t>(rows, (int64_t(1) << 31) / kMaxCluster);
    launch_cluster(ctx, "cross_entropy_with_grad cluster kernel launch", kernel,
                   dim3(unsigned(clusters_x * plan.cluster), unsigned((rows + clusters_x - 1) / clusters_x)),
                   dim3(unsigned(kThreads)), size_t(plan.smem_bytes), plan.cluster, p, slice_units);
    if (red != Red::none && !few) launch_row_reduce(ctx, reduce, "cross_entropy_with_grad reduction launch");
  });
}

// The exp-once kernel over rows of f32 logits (ce_grad_rows, loss_cuda.h), TOut the gradient's dtype.
template <class TOut> void* rows_kernel() {
  return reinterpret_cast<void*>(&with_grad_once_kernel<float, TOut>);
}
void* rows_kernel_for(DType grad) {
  switch (grad) {
    case DType::f32: return rows_kernel<float>();
    case DType::f16: return rows_kernel<__half>();
    case DType::bf16: return rows_kernel<__nv_bfloat16>();
    default: return nullptr;
  }
}
CeGradClusterPlan rows_plan(int device, int64_t vocab) {
  const CudaDeviceProps& props = cuda_device_props(device);
  return ce_grad_cluster_plan(vocab, 4, 4, props.cc_major, smem_budget(props), props.shared_per_sm / 3 - kSmemMargin,
                              forced_cluster());
}

}  // namespace
}  // namespace cuda::loss

using namespace cuda::loss;  // NOLINT

bool ce_grad_rows_fit(const Context& ctx, int64_t vocab, DType grad_dtype) {
  void* kernel = rows_kernel_for(grad_dtype);
  if (kernel == nullptr || vocab <= 0 || vocab % 4 != 0) return false;
  cuda::DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = rows_plan(ctx.device.index, vocab);
  return plan.cluster > 0 && cluster_fits(ctx.device.index, kernel, plan,
                                          smem_budget(cuda_device_props(ctx.device.index)));
}

void ce_grad_rows(const Context& ctx, const CeGradRows& a) {
  if (a.rows == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = rows_plan(ctx.device.index, a.vocab);
  auto launch_with = [&](auto out_tag) {
    using TOut = decltype(out_tag);
    FusedArgs<float, TOut> p{};
    p.logits = a.logits, p.logits_stride = a.ld;
    p.dlogits = static_cast<TOut*>(a.grad), p.dlogits_stride = a.grad_ld;
    p.rows = a.rows, p.vocab = a.vocab;
    p.target = a.target, p.target_stride = a.target_stride;
    p.dloss = a.up, p.dloss_dtype = a.up_dtype, p.dloss_stride = a.up_stride;
    p.kept = nullptr;
    p.loss = a.loss, p.loss_stride = a.loss_stride;
    p.lse = a.lse, p.lse_stride = a.lse_stride;
    p.ignore_index = a.ignore_index;
    p.smoothing = a.smoothing, p.z_scale = 0.0f, p.softcap = 0.0f;
    const int64_t clusters_x = std::min<int64_t>(a.rows, (int64_t(1) << 31) / kMaxCluster);
    ClusterLaunch launch(plan, dim3(unsigned(clusters_x * plan.cluster), unsigned((a.rows + clusters_x - 1) / clusters_x)),
                         cuda::stream_of(ctx));
    const cudaError_t status = cudaLaunchKernelEx(&launch.config, &with_grad_once_kernel<float, TOut>, p,
                                                  int64_t(plan.slice / 4));
    if (status != cudaSuccess) {
      cudaGetLastError();
      cuda::throw_cuda_error("fused_linear_cross_entropy_with_grad cluster kernel launch", status);
    }
  };
  switch (a.grad_dtype) {
    case DType::f32: return launch_with(float{});
    case DType::f16: return launch_with(__half{});
    case DType::bf16: return launch_with(__nv_bfloat16{});
    default: cuda::throw_cuda_error("fused_linear_cross_entropy_with_grad: gradient dtype", cudaErrorInvalidValue);
  }
}

void cross_entropy_with_grad_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                  const TensorView& dlogits, const TensorView& logits, const TensorView& target,
                                  const TensorView& dloss, int64_t ignore_index, double label_smoothing,
                                  double lse_square_scale, double softcap, std::string_view reduction) {
  two_passes(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
             softcap, reduction);
}
void cross_entropy_with_grad_cuda_cluster(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                          const TensorView& dlogits, const TensorView& logits,
                                          const TensorView& target, const TensorView& dloss, int64_t ignore_index,
                                          double label_smoothing, double lse_square_scale, double softcap,
                                          std::string_view reduction) {
  with_grad<false>(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
                   softcap, reduction);
}
void cross_entropy_with_grad_cuda_cluster_vec16(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                                const TensorView& dlogits, const TensorView& logits,
                                                const TensorView& target, const TensorView& dloss,
                                                int64_t ignore_index, double label_smoothing,
                                                double lse_square_scale, double softcap,
                                                std::string_view reduction) {
  with_grad<true>(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
                  softcap, reduction);
}

const char* cross_entropy_with_grad_cuda_applicable(const TensorView& loss, const TensorView& lse,
                                                    const TensorView& dlogits, const TensorView& logits,
                                                    const TensorView& target, const TensorView& dloss, int64_t i,
                                                    double ls, double z, double c, std::string_view r) {
  if (const char* why = cross_entropy_cuda_applicable(loss, lse, logits, target, i, ls, z, c, r)) return why;
  return cross_entropy_backward_cuda_applicable(dlogits, dloss, logits, target, lse, i, ls, z, c, r);
}
const char* cross_entropy_with_grad_cuda_cluster_applicable(const TensorView& loss, const TensorView& lse,
                                                            const TensorView& dlogits, const TensorView& logits,
                                                            const TensorView& target, const TensorView& dloss,
                                                            int64_t i, double ls, double z, double c,
                                                            std::string_view r) {
  if (const char* why = cross_entropy_with_grad_cuda_applicable(loss, lse, dlogits, logits, target, dloss, i, ls, z,
                                                                c, r))
    return why;
  return plan_for(logits, false).why;
}
const char* cross_entropy_with_grad_cuda_cluster_vec16_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView& dlogits, const TensorView& logits,
    const TensorView& target, const TensorView& dloss, int64_t i, double ls, double z, double c,
    std::string_view r) {
  if (const char* why = cross_entropy_with_grad_cuda_applicable(loss, lse, dlogits, logits, target, dloss, i, ls, z,
                                                                c, r))
    return why;
  if (const char* why = cuda::pack_rows_problem(logits, logits.size(1))) return why;
  if (const char* why = cuda::pack_rows_problem(dlogits, dlogits.size(1))) return why;
  return plan_for(logits, true).why;
}

void register_ce_with_grad_cuda(Registry& reg) {
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda_cluster_vec16", 300,
                       "one read of each row: a cluster of CTAs holds it in shared memory (16-byte cp.async), "
                       "statistics merged through distributed shared memory, dlogits written from the copy "
                       "(without a softcap: from each element's exp, kept in place of it)",
                       false),
      &cross_entropy_with_grad_cuda_cluster_vec16, &cross_entropy_with_grad_cuda_cluster_vec16_applicable);
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda_cluster", 200,
                       "any layout: one read of each row into a cluster's shared memory, single elements", false),
      &cross_entropy_with_grad_cuda_cluster, &cross_entropy_with_grad_cuda_cluster_applicable);
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda", 100,
                       "cross_entropy's kernel then cross_entropy_backward's (two reads of the logits): any row "
                       "length, no clusters",
                       false),
      &cross_entropy_with_grad_cuda, &cross_entropy_with_grad_cuda_applicable);
}

}  // namespace opforge
