// cross_entropy's forward at a few rows an SM through a shared-memory row pipeline filled by the
// copy engine.
//
// Note [cross_entropy row pipeline]: the row kernel (Note [row threads], ops/loss/cuda.cu) packs
// several rows into a block, so at a few rows an SM it launches fewer blocks than the card has
// SMs: 140 rows of 9,000 (1,125 packs in bf16, 64 threads a row, 4 rows a block) are 35 blocks.
// There one 512-thread block an SM walks the rows instead (block b of G: rows b, b + G, ...),
// each row one 1-D bulk copy into a ring of two shared-memory stages (Note [row ring] in
// cuda_launch.cuh), so the next rows are on their way while a row is reduced.
//  - A row: thread 0 loads the row's target first (in flight during the wait); every thread waits
//    on the stage, scans its packs from shared memory into the online (max, sum of exp) and
//    sum(z) as the row kernel does from global memory (scan_units, softcap on the fly), and
//    thread 0 takes the target's logit from the stage. The block reduction's barriers follow
//    every read of the stage, so thread 0 then refills it with the row two rows ahead and
//    finishes the row (lse, loss: finish_row). sum / mean follow as for the row kernel (Note [loss
//    row reduction]).
//  - Taken for the 16-byte-pack candidate at compute capability 9.0 and on, at least as many
//    rows as SMs, rows longer than 1,024 packs, two stages of a row in a block's shared memory
//    (bf16 / f16 vocab up to about 58,000, f32 29,000), and where the row kernel would launch
//    fewer blocks than SMs. H200, in one call (docs/perf/gpu-h200-2026-11-30-round30.md): 140 x
//    9,000 with every option, bf16 16.1 -> 8.9 us, f16 16.1 -> 8.8, f32 12.3 -> 10.6. Where the
//    row kernel fills the card it stays: bf16 1,024 x 32,000 took 27.7 us here against its 22.2
//    (one block an SM issues in about half the cycles and the scan's per-element work, not the
//    memory, then bounds a row; holding the packs in registers with tree reductions, as Note
//    [softmax row pipeline] does, measured slower still, 29.4 us).
//  - Assumes what the vec16 predicate checks: 16-byte aligned rows (base and stride), the vocab a
//    multiple of the pack, so a row is a whole number of 16-byte units, as a bulk copy needs.
//    int64 row offsets, one launch on ctx.stream, no host synchronization, no allocation.
//  - OPFORGE_CUDA_CE_PIPELINE=0 turns it off (side-by-side timing).
#include <algorithm>

#include "ops/loss/ce_forward.cuh"

namespace opforge::cuda::loss {
namespace {

using namespace cuda::rows;  // NOLINT: row_stats, row_sum

constexpr int kPipeThreads = 512;
constexpr int kPipeStages = 2;
constexpr int64_t kPipeMinUnits = 1024;

template <class T>
__global__ void __launch_bounds__(kPipeThreads, 1) forward_pipeline_kernel(ForwardArgs<T> p) {
  constexpr int W = UnitOf<T, true>::width;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kPipeStages];
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  const int64_t units = p.vocab / W;
  const uint32_t row_bytes = uint32_t(units) * 16u;
  programmatic_prologue();  // Note [programmatic launch]

  auto issue = [&](int64_t row, int s) {  // Note [row ring]
    if (row < p.rows) ring_fill(ring + size_t(s) * row_bytes, p.logits + row * p.logits_stride, row_bytes, &full[s]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kPipeStages; ++s) bulk_barrier_init(&full[s]);
    for (int s = 0; s < kPipeStages; ++s) issue(int64_t(blockIdx.x) + int64_t(s) * gridDim.x, s);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  RingCursor at;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {  // block-uniform
    int64_t t = 0;
    if (threadIdx.x == 0) t = p.target[row * p.target_stride];
    bulk_wait(&full[at.stage], at.parity);
    const T* x = reinterpret_cast<const T*>(ring + size_t(at.stage) * row_bytes);
    Stats st{-INFINITY, 0.0f};
    float sum_z = 0.0f;
    scan_units<T, true, true>(x, threadIdx.x, units, kPipeThreads, p.o.softcap, st, sum_z);
    // The target's logit, from the stage (0 for an ignored row, NaN out of range: load_target).
    float zt = 0.0f;
    if (threadIdx.x == 0 && t != p.o.ignore_index)
      zt = (t < 0 || t >= p.vocab) ? NAN : cap(to_f32(x[t]), p.o.softcap);
    st = row_stats<T>(st, kPipeThreads, stats_scratch);
    if (p.o.smoothing > 0.0f) sum_z = row_sum(sum_z, kPipeThreads, sum_scratch);
    // Every thread's reads of the stage precede the reduction's barriers: refill it.
    if (threadIdx.x == 0) {
      issue(row + int64_t(kPipeStages) * gridDim.x, at.stage);
      finish_row(p, row, st, sum_z, t, zt);
    }
    ring_advance(at, kPipeStages);
  }
}

}  // namespace

template <class T>
bool launch_forward_pipeline(const Context& ctx, const ForwardArgs<T>& p, int64_t units, int64_t row_kernel_blocks) {
  static const bool off = env_off("OPFORGE_CUDA_CE_PIPELINE");
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  if (off || props.cc_major < 9 || p.rows < props.sm_count || units <= kPipeMinUnits ||
      row_kernel_blocks >= props.sm_count)
    return false;
  auto kernel = forward_pipeline_kernel<T>;
  static const int64_t room = dynamic_smem_room(reinterpret_cast<const void*>(kernel), props);
  const int64_t smem = kPipeStages * units * 16;
  if (smem > room) return false;
  // Blocks resident on the device at this shape (one an SM where two stages take most of its
  // shared memory; cached per shape).
  const int fit = cluster_max_active(ctx.device.index, reinterpret_cast<const void*>(kernel), 1, kPipeThreads,
                                     size_t(smem));
  if (fit < 1) return false;
  const int64_t blocks = std::min<int64_t>(p.rows, fit);
  launch_programmatic(ctx, "cross_entropy row pipeline launch", kernel, dim3(unsigned(blocks)), dim3(kPipeThreads),
                      size_t(smem), p);
  return true;
}

template bool launch_forward_pipeline<float>(const Context&, const ForwardArgs<float>&, int64_t, int64_t);
template bool launch_forward_pipeline<__half>(const Context&, const ForwardArgs<__half>&, int64_t, int64_t);
template bool launch_forward_pipeline<__nv_bfloat16>(const Context&, const ForwardArgs<__nv_bfloat16>&, int64_t, int64_t);

}  // namespace opforge::cuda::loss
