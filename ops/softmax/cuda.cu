// CUDA kernels of the softmax family: softmax, log_softmax and their backward ops.
//
// Math (the ops' docs, ops/softmax/softmax.h), all in f32 with one rounding per output:
//   softmax        y = exp(x - m) / s,            m = max(x), s = sum exp(x - m)
//   log_softmax    y = x - m - log(s)
//   softmax bwd    dx = y * (dy - sum(dy * y))
//   log_sm bwd     dx = dy - exp(y) * sum(dy)
//
// Technique. Row-wise and memory-bound: the ideal moves each input once and each output once.
//  - One row per group of `row threads` (a power of two from 32 to 256) in 256-thread blocks: short
//    rows get one warp (8 rows per block, reduced with shuffles), long rows up to the whole block (warp partials
//    merged through shared memory). Launch: rows strided over a grid capped at 65535 x SMs
//    worth of blocks; int64 offsets (row * row_stride), so 2^31 elements and more index correctly.
//  - Forward is one pass for the statistics and one for the output. The statistics pass is
//    online: each thread keeps (max, sum of exp(x - max)) and rescales its sum when the max grows,
//    so the row is read once for both; the groups' pairs are merged in a fixed butterfly order,
//    so every thread of a row holds the same bits (deterministic). Each thread keeps up to
//    kCache of its units in registers; rows longer than kCache x row threads units read the rest
//    again in the output pass (an L2 hit for the rows in flight).
//  - Few rows (fewer than SMs): Note [few-row softmax cluster], else Note [split softmax rows],
//    below. Many rows longer than kCache x 256 units (16-byte packs): the forwards stream them
//    through shared memory (Note [softmax row pipeline], cuda_pipeline.cu), the backwards take the
//    same cluster kernel, a row on up to 8 CTAs (Note [many-row cluster], cluster_plan.h).
//  - cuda_vec16 (priority 200) moves 16-byte packs (8 bf16/f16 or 4 f32): needs 16-byte aligned
//    bases, row lengths and strides multiples of the pack (the predicate says which fails);
//    cuda (priority 100) walks single elements and accepts any layout the check accepts.
//  - exp per Note [element exp] (cuda_launch.cuh), accurate logf. One launch on ctx.stream, no host
//    synchronization, no allocation.
//
// Aliasing: y may alias x (forward) and dx may alias dy (backward) exactly: each element is read
// and written by the same thread, and the writes come after the row's reduction.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include <cooperative_groups.h>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/softmax/cluster_plan.h"
#include "ops/softmax/cuda_common.cuh"
#include "ops/softmax/row_reduce.cuh"
#include "ops/softmax/softmax_cuda.h"

namespace opforge {
namespace cuda::softmax {
namespace {

namespace cg = cooperative_groups;
using namespace cuda::rows;  // NOLINT: UnitOf, Stats, row_stats, row_sum

constexpr int kCache = 4;  // units kept in registers per thread (a pack is 4 registers)

template <class T, bool kVec, Kind kKind>
__global__ void __launch_bounds__(256) softmax_kernel(Args<T> p, int rt) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  constexpr bool kBackward = is_backward(kKind);
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  const int64_t units = p.n / W;
  const int rows_per_block = int(blockDim.x) / rt;
  const int64_t tid = int(threadIdx.x) % rt;
  const int64_t row_step = int64_t(gridDim.x) * rows_per_block;
  // Every thread of a block runs the same number of iterations (the block reductions need it);
  // rows past the end do no memory work.
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < p.rows; base += row_step) {
    const int64_t row = base + int(threadIdx.x) / rt;
    const int64_t live_units = row < p.rows ? units : 0;
    const int64_t r = row < p.rows ? row : 0;
    const T* a = p.a + r * p.a_stride;
    const T* b = kBackward ? p.b + r * p.b_stride : nullptr;
    T* out = p.out + r * p.out_stride;
    typename U::Raw ca[kCache], cb[kBackward ? kCache : 1];
    if constexpr (!kBackward) {
      Stats st{-INFINITY, 0.0f};
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t u = tid + int64_t(c) * rt;
        if (u < live_units) {
          ca[c] = U::load(a + u * W);
          st = add_unit<T>(st, U::widen(ca[c]).v);
        }
      }
      for (int64_t u = tid + int64_t(kCache) * rt; u < live_units; u += rt)
        st = add_unit<T>(st, U::widen(U::load(a + u * W)).v);
      st = row_stats<T>(st, rt, stats_scratch);
      const float inv_s = 1.0f / st.s, log_s = logf(st.s), m2 = st.m * kLog2e;
      auto emit = [&](int64_t u, typename U::Floats x) {
#pragma unroll
        for (int j = 0; j < W; ++j)
          x.v[j] = forward_out<T, kKind>(x.v[j], st.m, m2, inv_s, log_s);
        U::store(out + u * W, x);
      };
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t u = tid + int64_t(c) * rt;
        if (u < live_units) emit(u, U::widen(ca[c]));
      }
      for (int64_t u = tid + int64_t(kCache) * rt; u < live_units; u += rt) emit(u, U::widen(U::load(a + u * W)));
    } else {
      float acc = 0.0f;
      auto accumulate = [&](const typename U::Floats& g, const typename U::Floats& y) {
#pragma unroll
        for (int j = 0; j < W; ++j) acc += row_term<kKind>(g.v[j], y.v[j]);
      };
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t u = tid + int64_t(c) * rt;
        if (u < live_units) {
          ca[c] = U::load(a + u * W);
          cb[c] = U::load(b + u * W);
          accumulate(U::widen(ca[c]), U::widen(cb[c]));
        }
      }
      for (int64_t u = tid + int64_t(kCache) * rt; u < live_units; u += rt)
        accumulate(U::widen(U::load(a + u * W)), U::widen(U::load(b + u * W)));
      const float total = row_sum(acc, rt, sum_scratch);
      auto emit = [&](int64_t u, typename U::Floats g, const typename U::Floats& y) {
#pragma unroll
        for (int j = 0; j < W; ++j)
          g.v[j] = backward_out<T, kKind>(g.v[j], y.v[j], total);
        U::store(out + u * W, g);
      };
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t u = tid + int64_t(c) * rt;
        if (u < live_units) emit(u, U::widen(ca[c]), U::widen(cb[c]));
      }
      for (int64_t u = tid + int64_t(kCache) * rt; u < live_units; u += rt)
        emit(u, U::widen(U::load(a + u * W)), U::widen(U::load(b + u * W)));
    }
  }
}

// Note [split softmax rows]: with fewer rows than SMs, a row group per row leaves most SMs idle
// and makes each thread stream dozens of units (16 rows of a 128256 vocab in bf16: 16 blocks,
// 42.5 us on an H200; split, 9.0 us). Then a row is cut into `splits` segments, one 256-thread
// block each, with at most kCache units a thread held in registers. The launch is cooperative (every block resident): a
// block publishes its segment's partial (forward: max and sum of exp; backward: sum of dy * y or
// of dy), meets the others at a grid barrier (Note [grid barrier]), merges its row's partials in
// segment order (so every block of a row gets the same bits) and writes its segment from the
// registers: each element read once and written once, in one launch. Partials: 2 floats per
// segment in the stream's workspace. At most kMaxSplits segments a row.
constexpr int kSplitThreads = 256;
constexpr int kMaxSplits = 256;

template <class T, bool kVec, Kind kKind>
__global__ void __launch_bounds__(kSplitThreads) softmax_split_kernel(Args<T> p, int64_t splits, int64_t seg_units,
                                                                      float* partials, unsigned* barrier) {
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  constexpr bool kBackward = is_backward(kKind);
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  __shared__ float parts[2 * kMaxSplits];
  __shared__ float merged[2];
  programmatic_prologue();  // Note [programmatic launch]
  const int64_t units = p.n / W;
  const int64_t row = int64_t(blockIdx.x) / splits, seg = int64_t(blockIdx.x) % splits;
  const int64_t begin = seg * seg_units, end = min(units, begin + seg_units);
  const T* a = p.a + row * p.a_stride;
  const T* b = kBackward ? p.b + row * p.b_stride : nullptr;
  T* out = p.out + row * p.out_stride;
  float* mine = partials + 2 * (row * splits + seg);
  typename U::Raw ca[kCache], cb[kBackward ? kCache : 1];
  if constexpr (!kBackward) {
    Stats st{-INFINITY, 0.0f};
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t u = begin + threadIdx.x + int64_t(c) * kSplitThreads;
      if (u < end) ca[c] = U::load(a + u * W);
    }
#pragma unroll
    for (int c = 0; c < kCache; ++c)
      if (begin + threadIdx.x + int64_t(c) * kSplitThreads < end) st = add_unit<T>(st, U::widen(ca[c]).v);
    st = row_stats<T>(st, kSplitThreads, stats_scratch);
    if (threadIdx.x == 0) mine[0] = st.m, mine[1] = st.s;
  } else {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t u = begin + threadIdx.x + int64_t(c) * kSplitThreads;
      if (u < end) ca[c] = U::load(a + u * W), cb[c] = U::load(b + u * W);
    }
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      if (begin + threadIdx.x + int64_t(c) * kSplitThreads >= end) continue;
      const typename U::Floats g = U::widen(ca[c]), y = U::widen(cb[c]);
#pragma unroll
      for (int j = 0; j < W; ++j) acc += row_term<kKind>(g.v[j], y.v[j]);
    }
    acc = row_sum(acc, kSplitThreads, sum_scratch);
    if (threadIdx.x == 0) mine[0] = acc, mine[1] = 0.0f;
  }
  grid_barrier(barrier, gridDim.x);
  // The row's partials, loaded in parallel, merged by thread 0 in segment order.
  for (int64_t i = threadIdx.x; i < 2 * splits; i += kSplitThreads) parts[i] = __ldcg(partials + 2 * row * splits + i);
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (!kBackward) {
      const Stats st = merge_all<T>(reinterpret_cast<const Stats*>(parts), int(splits));  // (m, s) pairs
      merged[0] = st.m, merged[1] = st.s;
    } else {
      float total = parts[0];
      for (int64_t g = 1; g < splits; ++g) total += parts[2 * g];
      merged[0] = total;
    }
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t u = begin + threadIdx.x + int64_t(c) * kSplitThreads;
    if (u >= end) continue;
    if constexpr (!kBackward) {
      const float m = merged[0], inv_s = 1.0f / merged[1], log_s = logf(merged[1]), m2 = m * kLog2e;
      typename U::Floats x = U::widen(ca[c]);
#pragma unroll
      for (int j = 0; j < W; ++j)
        x.v[j] = forward_out<T, kKind>(x.v[j], m, m2, inv_s, log_s);
      U::store(out + u * W, x);
    } else {
      const float total = merged[0];
      typename U::Floats g = U::widen(ca[c]);
      const typename U::Floats y = U::widen(cb[c]);
#pragma unroll
      for (int j = 0; j < W; ++j)
        g.v[j] = backward_out<T, kKind>(g.v[j], y.v[j], total);
      U::store(out + u * W, g);
    }
  }
}

// Note [few-row softmax cluster] (compute capability 9.0 on; Note [cluster launch]): with fewer
// rows than SMs and a row that fits, a row is cut into `ranks` (2..16) contiguous segments, one
// CTA of 256 threads each, the CTAs of a row forming one thread-block cluster. Every thread holds
// up to kUnits units of its segment in registers, all loaded at once (one memory round
// trip); the CTA's partial (forward: max and sum of exp; backward: sum of dy * y or of dy) goes
// to its shared memory, and after one cluster barrier every CTA fetches the row's partials through
// distributed shared memory (a thread per rank) and merges them in rank order (every CTA of the
// row gets the same bits), then writes its segment from the registers. Against the split kernel
// it replaces there: no cooperative launch (the launch is programmatic), no grid barrier through
// global memory, no workspace; the clusters of different rows never wait for each other. Small CTAs (an SM holds
// several) keep a cluster's co-scheduling easy: 16 rows of 8 CTAs need 128 CTA slots, not 128
// whole SMs. The plan (few_row_plan, cluster_plan.h): 4 units a thread where up to 8 CTAs hold
// the row (16 when the rows' 16 CTAs fit two an SM: the non-portable cluster sizes of
// compute capability 9.0), else 8 units a thread and 8 CTAs; rows longer than 8 x 256 x 8 units
// (bf16: 131,072 elements) take the split kernel. The kernel with 4 units a thread is the shorter one (94 -> 60
// registers in the bf16 softmax): H200, bf16, against 8 units a thread in one call: softmax 16 x
// 4,096 3.50 -> 3.08 us, 16 x 32,000 5.04 -> 4.27, 1 x 128,256 (16 CTAs) 5.37 -> 4.55,
// log_softmax likewise, the backward ops 0.25-0.45 us faster (docs/perf/gpu-h200-2026-11-28-round20.md).
// 16 x 128,256 on 16 CTAs a row (two an SM) measured slower then (7.22 -> 8.04) and faster with
// the kernel as it is now (softmax 5.38 -> 4.79: docs/perf/gpu-h200-2026-12-02-round38.md).
// A thread's work is a chain of math over its 32-64 register-held values with two warps a
// scheduler to hide it (Nsight Compute: stalls on fixed-latency dependencies), so the kernel is
// written for few, independent instructions: the forward's units past the row hold -inf (no
// branch a unit), the thread's max and sum of exps are pairwise trees (tree_reduce), exps of
// 16-bit data are one ex2.approx.ftz each (Note [element exp]) also in the merges of partials,
// and the 16-bit softmax keeps each exp(x - thread max) in the register it came from: its output
// is that times exp(thread max - row max) / sum, one multiply, where recomputing it took a second
// exp an element. The backward's sums are a chain a unit (one FFMA an element) with the units'
// chains independent; its loads stay guarded (a neutral fill there made the 8-unit kernel spill).
// bf16 softmax, 64 values a thread, SASS instructions written out (cuobjdump): 1,912 -> 1,184,
// then 1,280 with the merges' one-instruction exps unrolled (the accurate expf had run in loops:
// executed counts not measured); H200 16 x 128,256 7.09 -> 5.39 us (docs/perf/gpu-h200-2026-11-29-round25.md).
constexpr int kClusterCtas = 16;  // the most CTAs a row

template <class T, bool kVec, Kind kKind, int kClusterUnits>
__global__ void __launch_bounds__(kClusterThreads, 2) softmax_cluster_kernel(Args<T> p, int64_t seg_units) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, kVec>;
  constexpr bool kBackward = is_backward(kKind);
  constexpr int W = U::width;
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  __shared__ Stats part;  // this CTA's partial, read by every CTA of the cluster (backward: the sum in .m)
  __shared__ Stats parts[kClusterCtas];  // the cluster's partials, in rank order
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  const int64_t row = int64_t(blockIdx.x) / ranks;
  const int64_t units = p.n / W;
  const int64_t begin = int64_t(rank) * seg_units, end = min(units, begin + seg_units);
  const T* a = p.a + row * p.a_stride;
  const T* b = kBackward ? p.b + row * p.b_stride : nullptr;
  T* out = p.out + row * p.out_stride;
  // Units past the row's end hold the reductions' neutral values (forward -inf: exp 0; backward
  // 0), so that the math below runs on every unit with no branch; only the stores check the end.
  typename U::Raw ca[kClusterUnits], cb[kBackward ? kClusterUnits : 1];
  constexpr float fill = kBackward ? 0.0f : -INFINITY;
#pragma unroll
  for (int c = 0; c < kClusterUnits; ++c) {
    const int64_t u = begin + threadIdx.x + int64_t(c) * kClusterThreads;
    const bool in = u < end;
    if constexpr (kBackward) {
      if (in) ca[c] = U::load(a + u * W), cb[c] = U::load(b + u * W);
    } else {
      ca[c] = U::load_or(a + u * W, in, fill);
    }
  }
  // Forward: v holds x, or for softmax of 16-bit data exp(x - the thread's max) (kKeepExp: each
  // exp taken once; the output is that times exp(thread max - row max) / sum, one multiply).
  constexpr bool kKeepExp = kKind == Kind::softmax && !std::is_same_v<T, float>;
  float v[kBackward ? 1 : kClusterUnits][W];
  float thread_max = 0.0f;
  if constexpr (!kBackward) {
#pragma unroll
    for (int c = 0; c < kClusterUnits; ++c) {
      const typename U::Floats f = U::widen(ca[c]);
#pragma unroll
      for (int j = 0; j < W; ++j) v[c][j] = f.v[j];
    }
    Stats st = cached_stats<T, kKeepExp>(v);
    thread_max = st.m;
    st = row_stats<T>(st, kClusterThreads, stats_scratch);
    if (threadIdx.x == 0) part = st;
  } else {
    float acc[kClusterUnits];
#pragma unroll
    for (int c = 0; c < kClusterUnits; ++c) {
      // A chain a unit (one FFMA an element), the units' chains independent.
      acc[c] = 0.0f;
      if (begin + threadIdx.x + int64_t(c) * kClusterThreads >= end) continue;
      const typename U::Floats g = U::widen(ca[c]), y = U::widen(cb[c]);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[c] += row_term<kKind>(g.v[j], y.v[j]);
    }
    const float sum = row_sum(tree_reduce(acc, [](float x, float y2) { return x + y2; }), kClusterThreads, sum_scratch);
    if (threadIdx.x == 0) part = Stats{sum, 0.0f};
  }
  cluster.sync();
  // Thread r < ranks fetches rank r's partial (one remote load each: every thread fetching all of
  // them queued 256 x ranks requests on each CTA's shared memory), then every thread merges the
  // local copies in rank order.
  if (threadIdx.x < ranks) parts[threadIdx.x] = *cluster.map_shared_rank(&part, threadIdx.x);
  cluster_arrive();  // done with the other CTAs' shared memory
  __syncthreads();   // parts
  Stats total = parts[0];
  if constexpr (!kBackward) total = merge_all<T>(parts, int(ranks));
  else
    for (unsigned r = 1; r < ranks; ++r) total.m += parts[r].m;  // the backward's sums
  const float inv_s = 1.0f / total.s, log_s = logf(total.s), m2 = total.m * kLog2e;
  // kKeepExp: exp(thread max - row max) / sum (NaN where the row is all -inf, as the recomputed
  // form gives).
  const float scale = kKeepExp ? exp_of<T>(thread_max - total.m) * inv_s : 0.0f;
#pragma unroll
  for (int c = 0; c < kClusterUnits; ++c) {
    const int64_t u = begin + threadIdx.x + int64_t(c) * kClusterThreads;
    if (u >= end) continue;
    if constexpr (!kBackward) {
      typename U::Floats x;
#pragma unroll
      for (int j = 0; j < W; ++j)
        x.v[j] = kKeepExp ? v[c][j] * scale : forward_out<T, kKind>(v[c][j], total.m, m2, inv_s, log_s);
      U::store(out + u * W, x);
    } else {
      typename U::Floats g = U::widen(U::opaque(ca[c]));
      const typename U::Floats y = U::widen(U::opaque(cb[c]));
#pragma unroll
      for (int j = 0; j < W; ++j)
        g.v[j] = backward_out<T, kKind>(g.v[j], y.v[j], total.m);
      U::store(out + u * W, g);
    }
  }
  cluster_wait();  // no CTA leaves while another may still read its `part`
}

// Launches the few-row cluster kernel with kUnits units a thread and `ranks` CTAs a row; false
// when the device cannot co-schedule such a cluster.
template <class T, bool kVec, Kind kKind, int kUnits>
bool launch_cluster_units(const Context& ctx, const Args<T>& p, int64_t units, int ranks) {
  auto kernel = softmax_cluster_kernel<T, kVec, kKind, kUnits>;
  if (ranks > 8) {
    static const bool allowed = [&] {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) return true;
      cudaGetLastError();  // a refusal means "8 at most", not an error
      return false;
    }();
    if (!allowed) return false;
  }
  if (!cluster_launch_fits(ctx.device.index, reinterpret_cast<const void*>(kernel), ranks, kClusterThreads, 0))
    return false;
  launch_cluster(ctx, "softmax cluster launch", kernel, dim3(unsigned(p.rows * ranks)), dim3(kClusterThreads), 0,
                 ranks, p, (units + ranks - 1) / ranks);
  return true;
}

// Note [few-row softmax cluster]'s plan (few_row_plan, ops/softmax/cluster_plan.h), or Note
// [many-row cluster]'s for rows longer than the row kernel holds; false when neither takes the
// call. OPFORGE_CUDA_SOFTMAX_CLUSTER_UNITS=8 always takes 8 units a thread on up to 8 CTAs (tuning).
template <class T, bool kVec, Kind kKind>
bool launch_few_rows(const Context& ctx, const Args<T>& p, int64_t units, const CudaDeviceProps& props) {
  if (!cluster_rows_enabled()) return false;
  static const bool eight_only = env_choice("OPFORGE_CUDA_SOFTMAX_CLUSTER_UNITS", 8, 8) == 8;
  // Note [many-row cluster] past the rows the row kernel holds in registers (kCache units a thread,
  // up to 256 threads a row), with 8 units a thread for the forward kinds: bf16 1,024 x 32,000 on
  // an H200, 4 against 8 units a thread (4 or 2 CTAs a row), two repetitions: softmax 48.7 / 48.6
  // -> 42.0 / 42.3 us, log_softmax 49.4 / 49.5 -> 42.7 / 42.7, the backward ops within 1%
  // (docs/perf/gpu-h200-2026-11-30-round28.md).
  constexpr int64_t kRowKernelUnits = int64_t(kCache) * 256;
  FewRowPlan plan;
  if (p.rows < props.sm_count) plan = few_row_plan(p.rows, units, props.sm_count, kVec && !eight_only);
  else if (kVec && many_row_clusters_enabled())
    plan = many_row_plan(p.rows, units, props.sm_count, kRowKernelUnits, is_backward(kKind) && !eight_only);
  if constexpr (kVec) {
    if (plan.units_per_thread == 4) {
      if (launch_cluster_units<T, kVec, kKind, 4>(ctx, p, units, plan.ranks)) return true;
      if (plan.ranks <= 8) return false;  // the device cannot co-schedule the cluster
      plan = few_row_plan(p.rows, units, props.sm_count, false);  // no 16-CTA cluster here
    }
  }
  return plan.ranks > 0 && launch_cluster_units<T, kVec, kKind, 8>(ctx, p, units, plan.ranks);
}

// Segments a row for Note [split softmax rows], or 1 to use softmax_kernel: enough blocks for
// about one per SM, at most as many as are resident at once, each thread's units in registers.
template <class T, bool kVec, Kind kKind> int64_t split_count(int64_t rows, int64_t units, const CudaDeviceProps& props) {
  if (rows >= props.sm_count || units < 2) return 1;
  static const int fit = [] {
    int n = 0;
    OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, softmax_split_kernel<T, kVec, kKind>,
                                                                     kSplitThreads, 0));
    return n;
  }();
  const int64_t resident = int64_t(fit) * props.sm_count;
  const int64_t least = (units + kSplitThreads * kCache - 1) / (kSplitThreads * kCache);
  // About one block per SM: at 16 rows on an H200 the forward took 7.9 us (128,256) and 5.8 (32,000)
  // against 8.7 / 6.7 with two and 9.8 / 8.5 with four, the backward the same or less (docs/perf/
  // gpu-h200-2026-11-27-round13.md). Tuning runs override the 1 with
  // OPFORGE_CUDA_SOFTMAX_BLOCKS_PER_SM (1..16).
  static const int per_sm = env_choice("OPFORGE_CUDA_SOFTMAX_BLOCKS_PER_SM", 1, 16);
  const int64_t want = std::max<int64_t>(least, ((per_sm ? per_sm : 1) * int64_t(props.sm_count) + rows - 1) / rows);
  const int64_t splits = std::min<int64_t>({want, kMaxSplits, units, resident / rows});
  return splits < 2 || splits < least ? 1 : splits;
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

template <bool kVec, Kind kKind>
void run(const Context& ctx, const TensorView& out, const TensorView& a, const TensorView* b) {
  const int64_t rows = a.rows(), n = a.size(-1);
  if (rows == 0 || n == 0) return;
  DeviceGuard guard(ctx.device.index);
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  dispatch_float(a.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = UnitOf<T, kVec>::width;
    Args<T> p{};
    p.out = out.ptr<T>(), p.out_stride = row_stride_of(out);
    p.a = a.ptr<T>(), p.a_stride = row_stride_of(a);
    if (b) p.b = b->ptr<T>(), p.b_stride = row_stride_of(*b);
    p.rows = rows;
    p.n = n;
    const int64_t units = n / W;
    if constexpr (kVec) {
      if (launch_row_pipeline<T, kKind>(ctx, p, units, props)) return;  // Note [softmax row pipeline]
    }
    if (launch_few_rows<T, kVec, kKind>(ctx, p, units, props)) return;
    if (int64_t splits = split_count<T, kVec, kKind>(rows, units, props); splits > 1) {
      const int64_t seg_units = (units + splits - 1) / splits;
      splits = (units + seg_units - 1) / seg_units;  // no empty segment
      auto* partials = static_cast<float*>(cuda_workspace(ctx, rows * splits * 2 * int64_t(sizeof(float))));
      launch_cooperative(ctx, "softmax split-row cooperative launch", softmax_split_kernel<T, kVec, kKind>,
                         rows * splits, kSplitThreads, 0, p, splits, seg_units, partials, cuda_grid_barrier(ctx));
      return;
    }
    // Row threads: a warp, or more until each thread has at most kCache units, at most a block of
    // 256 (longer rows stream the rest twice); 256-thread blocks keep several rows in flight per
    // SM, which is what hides the latency of a row's two phases.
    int rt = 32;
    while (rt < 256 && int64_t(rt) * kCache < units) rt *= 2;
    const int block = 256;
    const int64_t rows_per_block = block / rt;
    const int64_t max_blocks = int64_t(props.sm_count) * (2048 / block) * 4;
    const int64_t blocks = std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, max_blocks);
    launch_programmatic(ctx, "softmax kernel launch", softmax_kernel<T, kVec, kKind>, dim3(unsigned(blocks)),
                        dim3(block), 0, p, rt);
  });
}

const char* vec16_problem(std::initializer_list<const TensorView*> views) {
  for (const TensorView* t : views) {
    if (!is_cuda_float(t->dtype)) return kNotCudaFloat;
    if (const char* why = pack_rows_problem(*t, t->size(-1))) return why;
  }
  return nullptr;
}
const char* scalar_problem(const TensorView& t) { return is_cuda_float(t.dtype) ? nullptr : kNotCudaFloat; }

}  // namespace
}  // namespace cuda::softmax

using cuda::softmax::Kind;
using cuda::softmax::run;

// Entry points, one per (op, candidate); the predicates are the applicability checks.
#define OPFORGE_SOFTMAX_FORWARD_CUDA(op, kind)                                                        \
  void op##_cuda(const Context& ctx, const TensorView& y, const TensorView& x) {                    \
    run<false, kind>(ctx, y, x, nullptr);                                                           \
  }                                                                                                 \
  void op##_cuda_vec16(const Context& ctx, const TensorView& y, const TensorView& x) {              \
    run<true, kind>(ctx, y, x, nullptr);                                                            \
  }                                                                                                 \
  const char* op##_cuda_applicable(const TensorView&, const TensorView& x) {                        \
    return cuda::softmax::scalar_problem(x);                                                        \
  }                                                                                                 \
  const char* op##_cuda_vec16_applicable(const TensorView& y, const TensorView& x) {                \
    return cuda::softmax::vec16_problem({&y, &x});                                                  \
  }
#define OPFORGE_SOFTMAX_BACKWARD_CUDA(op, kind)                                                       \
  void op##_cuda(const Context& ctx, const TensorView& dx, const TensorView& dy, const TensorView& y) { \
    run<false, kind>(ctx, dx, dy, &y);                                                              \
  }                                                                                                 \
  void op##_cuda_vec16(const Context& ctx, const TensorView& dx, const TensorView& dy,              \
                       const TensorView& y) {                                                       \
    run<true, kind>(ctx, dx, dy, &y);                                                               \
  }                                                                                                 \
  const char* op##_cuda_applicable(const TensorView&, const TensorView&, const TensorView& y) {     \
    return cuda::softmax::scalar_problem(y);                                                        \
  }                                                                                                 \
  const char* op##_cuda_vec16_applicable(const TensorView& dx, const TensorView& dy,                \
                                         const TensorView& y) {                                     \
    return cuda::softmax::vec16_problem({&dx, &dy, &y});                                            \
  }

OPFORGE_SOFTMAX_FORWARD_CUDA(softmax, Kind::softmax)
OPFORGE_SOFTMAX_FORWARD_CUDA(log_softmax, Kind::log_softmax)
OPFORGE_SOFTMAX_BACKWARD_CUDA(softmax_backward, Kind::softmax_backward)
OPFORGE_SOFTMAX_BACKWARD_CUDA(log_softmax_backward, Kind::log_softmax_backward)
#undef OPFORGE_SOFTMAX_FORWARD_CUDA
#undef OPFORGE_SOFTMAX_BACKWARD_CUDA

void register_softmax_cuda(Registry& reg) {
  const char* vec = "16-byte packs, online (max, sum) in one read, row cached in registers, f32 math";
  const char* scalar = "any layout: one element per thread-step, online (max, sum), f32 math";
  reg.add_kernel<Softmax>(cuda_kernel_desc("cuda_vec16", 200, vec, true), &softmax_cuda_vec16,
                          &softmax_cuda_vec16_applicable);
  reg.add_kernel<Softmax>(cuda_kernel_desc("cuda", 100, scalar, true), &softmax_cuda, &softmax_cuda_applicable);
  reg.add_kernel<LogSoftmax>(cuda_kernel_desc("cuda_vec16", 200, vec, true), &log_softmax_cuda_vec16,
                             &log_softmax_cuda_vec16_applicable);
  reg.add_kernel<LogSoftmax>(cuda_kernel_desc("cuda", 100, scalar, true), &log_softmax_cuda,
                             &log_softmax_cuda_applicable);
  reg.add_kernel<SoftmaxBackward>(cuda_kernel_desc("cuda_vec16", 200, vec, true), &softmax_backward_cuda_vec16,
                                  &softmax_backward_cuda_vec16_applicable);
  reg.add_kernel<SoftmaxBackward>(cuda_kernel_desc("cuda", 100, scalar, true), &softmax_backward_cuda,
                                  &softmax_backward_cuda_applicable);
  reg.add_kernel<LogSoftmaxBackward>(cuda_kernel_desc("cuda_vec16", 200, vec, true),
                                     &log_softmax_backward_cuda_vec16, &log_softmax_backward_cuda_vec16_applicable);
  reg.add_kernel<LogSoftmaxBackward>(cuda_kernel_desc("cuda", 100, scalar, true), &log_softmax_backward_cuda,
                                     &log_softmax_backward_cuda_applicable);
}

}  // namespace opforge
