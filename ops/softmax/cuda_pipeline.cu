// softmax and log_softmax at many long rows through a shared-memory row pipeline filled by the
// copy engine.
//
// Note [softmax row pipeline]: the many-row cluster (Note [many-row cluster], cluster_plan.h)
// holds one row's segment in registers per CTA: a CTA loads it, reduces, merges over the cluster
// and stores, and only then does its SM start on the next CTA's loads, so an SM has a row in
// flight only between phases of math and barriers (H200, bf16, softmax 1,024 x 32,000 at 73% of
// the copy bandwidth, 256 x 128,256 at 62%). Here the CTAs stay resident and walk rows (cluster c
// of G takes rows c, c + G, ...); each keeps a ring of `stages` buffers in shared memory, one
// segment of a row each, filled by one 1-D bulk copy that completes on the buffer's mbarrier
// (Note [bulk copies] in cuda_launch.cuh). While a row is reduced, merged and written, the
// next stages - 1 rows are already being read, by the copy engine, with no registers or issue
// slots of the threads.
//  - Plan (pipeline_plan, cluster_plan.h): the fewest CTAs a row (1, 2, 4 or 8) whose segment
//    512 threads x 8 packs hold, with two stages in the block's shared memory; where that takes a
//    cluster and the many-row cluster holds the row, the row goes there instead (measured
//    faster). One CTA an SM (512 threads, up to 128 registers); the grid is as many clusters as
//    the device holds at once (cudaOccupancyMaxActiveClusters), at most one a row. H200
//    (docs/perf/gpu-h200-2026-11-30-round30.md), against the many-row cluster / row kernel in the
//    same call: bf16 1,024 x 32,000 (one CTA a row) softmax 42.0 -> 39.2 us (74% -> 80% of copy),
//    log_softmax 42.4 -> 38.8, f16 likewise; f32 256 x 128,256 (clusters of 8, where the row
//    kernel streamed) softmax 161.0 -> 116.8 (39% -> 53%), log_softmax 158.3 -> 111.8. Taken
//    on clusters where the many-row cluster holds the row it was slower: bf16 256 x 128,256 (4
//    CTAs a row) 57.6 against 49.6, f32 1,024 x 32,000 (2 CTAs) 100.4 against 95.0. What bounds
//    it (Nsight Compute, bf16 1,024 x 32,000): the schedulers issue in 48% of cycles, the warps
//    waiting on fixed latencies, the shared-memory queue and each other about equally: with one
//    CTA an SM every warp reaches a row's phases together.
//  - A row: every thread waits on its stage's barrier with that round's parity, reads its 8
//    packs into registers (-inf past the segment), and takes the (max, sum of exp) of its values
//    as the few-row cluster kernel does (cached_stats: max tree, then exps, for 16-bit softmax kept
//    in the registers they came from). The block reduction's barriers follow every thread's reads,
//    so thread 0 then refills the stage with the row `stages` rows ahead. With more than one CTA a
//    row, the CTA's partial goes to shared memory (two slots, by row parity), one cluster barrier,
//    and every CTA merges the row's partials in rank order (the same bits in every CTA). The
//    outputs leave from registers with streaming stores (Note [streaming stores]).
//  - Slot reuse: a CTA reads the other CTAs' partials of row i before it arrives at row i + 1's
//    cluster barrier, and the slot of row i is written again only at row i + 2, after that
//    barrier; a last cluster barrier keeps every CTA resident until the others' reads are done.
//  - Assumes what the vec16 predicate checks: 16-byte aligned rows (base and stride) whose
//    length is a multiple of the pack, so a segment is a whole number of 16-byte units, as a bulk
//    copy needs. f32 math as the other kernels (ops/softmax/cuda.cu), int64 row offsets, one
//    launch on ctx.stream, no host synchronization, no allocation.
//  - OPFORGE_CUDA_SOFTMAX_PIPELINE=0 turns it off (side-by-side timing, and checks of the
//    many-row cluster at these shapes).
#include <algorithm>
#include <type_traits>

#include <cooperative_groups.h>

#include "ops/softmax/cluster_plan.h"
#include "ops/softmax/cuda_common.cuh"

namespace opforge::cuda::softmax {
namespace {

namespace cg = cooperative_groups;
using namespace cuda::rows;  // NOLINT: UnitOf, Stats, cached_stats, row_stats, merge_all

constexpr int kPipeThreads = 512;
constexpr int kPipeUnits = 8;  // packs a thread: a segment of up to 4,096 packs (64 KB) a CTA
constexpr int kPipeMaxRanks = 8;

template <class T, Kind kKind, int kThreads, int kUnits>
__global__ void __launch_bounds__(kThreads, 1)
    softmax_pipeline_kernel(Args<T> p, int64_t seg_units, int stages) {
  static_assert(!is_backward(kKind), "the pipeline runs the forward kinds");
  using U = UnitOf<T, true>;
  constexpr int W = U::width;
  // 16-bit softmax keeps exp(x - thread max) in the registers (Note [few-row softmax cluster]).
  constexpr bool kKeepExp = kKind == Kind::softmax && !std::is_same_v<T, float>;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[4];  // up to 4 stages (the tuning override)
  __shared__ Stats stats_scratch[32];
  __shared__ Stats part[2];                // this CTA's partial of a row, by row parity
  __shared__ Stats parts[kPipeMaxRanks];   // the row's partials, in rank order
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  const int64_t clusters = int64_t(gridDim.x) / ranks, first = int64_t(blockIdx.x) / ranks;
  const int64_t begin = int64_t(rank) * seg_units;
  const int64_t seg = std::min<int64_t>(p.n / W - begin, seg_units);  // >= 1 (pipeline_plan)
  const uint32_t seg_bytes = uint32_t(seg) * 16u;
  const size_t stage_bytes = size_t(seg_units) * 16u;
  programmatic_prologue();  // Note [programmatic launch]

  // Thread 0: the bulk copy of this CTA's segment of `row` into stage s (none past the rows).
  auto issue = [&](int64_t row, int s) {  // Note [row ring]
    if (row < p.rows) ring_fill(ring + size_t(s) * stage_bytes, p.a + row * p.a_stride + begin * W, seg_bytes, &full[s]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bulk_barrier_init(&full[s]);
    for (int s = 0; s < stages; ++s) issue(first + s * clusters, s);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  RingCursor at;
  unsigned turn = 0;
  for (int64_t row = first; row < p.rows; row += clusters, ++turn) {  // uniform over the cluster
    bulk_wait(&full[at.stage], at.parity);
    const unsigned char* stage = ring + size_t(at.stage) * stage_bytes;
    float v[kUnits][W];
#pragma unroll
    for (int c = 0; c < kUnits; ++c) {
      const int u = int(threadIdx.x) + c * kThreads;
      const typename U::Floats f =
          U::widen(U::load_or(reinterpret_cast<const T*>(stage + size_t(u) * 16u), u < seg, -INFINITY));
#pragma unroll
      for (int j = 0; j < W; ++j) v[c][j] = f.v[j];
    }
    Stats st = cached_stats<T, kKeepExp>(v);
    const float thread_max = st.m;
    st = row_stats<T>(st, kThreads, stats_scratch);
    // Every thread's reads of the stage precede the reduction's barriers: refill it.
    if (threadIdx.x == 0) issue(row + int64_t(stages) * clusters, at.stage);
    Stats total = st;
    if (ranks > 1) {
      if (threadIdx.x == 0) part[turn & 1u] = st;
      cluster.sync();
      if (threadIdx.x < ranks) parts[threadIdx.x] = *cluster.map_shared_rank(&part[turn & 1u], threadIdx.x);
      __syncthreads();
      total = merge_all<T>(parts, int(ranks));
    }
    const float inv_s = 1.0f / total.s, log_s = logf(total.s), m2 = total.m * kLog2e;
    const float scale = kKeepExp ? exp_of<T>(thread_max - total.m) * inv_s : 0.0f;
    T* out = p.out + row * p.out_stride + begin * W;
#pragma unroll
    for (int c = 0; c < kUnits; ++c) {
      const int u = int(threadIdx.x) + c * kThreads;
      if (u >= seg) continue;
      PackFloats<T> y;
#pragma unroll
      for (int j = 0; j < W; ++j)
        y.v[j] = kKeepExp ? v[c][j] * scale : forward_out<T, kKind>(v[c][j], total.m, m2, inv_s, log_s);
      store_pack_streaming(out + int64_t(u) * W, narrow_pack<T>(y));  // Note [streaming stores]
    }
    ring_advance(at, stages);
  }
  if (ranks > 1) cluster.sync();  // no CTA leaves while another may still read its partials
}

}  // namespace

template <class T, Kind kKind>
bool launch_row_pipeline(const Context& ctx, const Args<T>& p, int64_t units, const CudaDeviceProps& props) {
  if constexpr (is_backward(kKind)) {
    return false;
  } else {
    static const bool off = env_off("OPFORGE_CUDA_SOFTMAX_PIPELINE");
    if (off || props.cc_major < 9 || !many_row_clusters_enabled()) return false;
    auto kernel = softmax_pipeline_kernel<T, kKind, kPipeThreads, kPipeUnits>;
    static const int64_t room = dynamic_smem_room(reinterpret_cast<const void*>(kernel), props);
    static const int stages = env_choice("OPFORGE_CUDA_SOFTMAX_PIPELINE_STAGES", 2, 4);  // tuning
    // Rows the row kernel keeps in registers stay there (kCache x 256 packs, cuda.cu), and rows
    // the many-row cluster holds on 2 to 8 CTAs of 8 packs a thread go there unless one CTA takes
    // them.
    constexpr int64_t kRowKernelUnits = 4 * 256, kClusterUnits = 8 * int64_t(kClusterThreads) * 8;
    PipelinePlan plan = pipeline_plan(p.rows, units, props.sm_count, kRowKernelUnits, kClusterUnits, room,
                                      kPipeThreads, kPipeUnits);
    if (plan.ranks == 0) return false;
    if (stages) plan.stages = int(std::min<int64_t>(stages, room / (plan.seg_units * 16)));
    const size_t smem = size_t(plan.stages) * size_t(plan.seg_units) * 16u;
    const int fit =
        cluster_max_active(ctx.device.index, reinterpret_cast<const void*>(kernel), plan.ranks, kPipeThreads, smem);
    if (fit < 1) return false;
    const int64_t clusters = std::min<int64_t>(p.rows, fit);
    launch_cluster(ctx, "softmax row pipeline launch", kernel, dim3(unsigned(clusters * plan.ranks)),
                   dim3(kPipeThreads), smem, plan.ranks, p, plan.seg_units, plan.stages);
    return true;
  }
}

#define OPFORGE_SOFTMAX_PIPELINE(T)                                                                          \
  template bool launch_row_pipeline<T, Kind::softmax>(const Context&, const Args<T>&, int64_t,               \
                                                      const CudaDeviceProps&);                               \
  template bool launch_row_pipeline<T, Kind::log_softmax>(const Context&, const Args<T>&, int64_t,           \
                                                          const CudaDeviceProps&);                           \
  template bool launch_row_pipeline<T, Kind::softmax_backward>(const Context&, const Args<T>&, int64_t,      \
                                                               const CudaDeviceProps&);                      \
  template bool launch_row_pipeline<T, Kind::log_softmax_backward>(const Context&, const Args<T>&, int64_t,  \
                                                                   const CudaDeviceProps&);
OPFORGE_SOFTMAX_PIPELINE(float)
OPFORGE_SOFTMAX_PIPELINE(__half)
OPFORGE_SOFTMAX_PIPELINE(__nv_bfloat16)
#undef OPFORGE_SOFTMAX_PIPELINE

}  // namespace opforge::cuda::softmax
