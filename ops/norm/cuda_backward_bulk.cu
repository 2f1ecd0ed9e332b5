// The many-row vec16 backward of rms_norm and fused_add_rms_norm (and Gemma's forms, offset 1)
// through a shared-memory row pipeline filled by the copy engine.
//
// Note [bulk-copy row pipeline]: the register-resident kernel (cuda_backward.cu) holds only the
// row it is reducing, so an SM has at most two rows of loads in flight (two 512-thread blocks of
// 64 registers) and none while its blocks reduce and write: rms_norm_backward at 16,384 x 4,096
// bf16 on an H200 read DRAM at 59% of its peak (Nsight Compute), 69% of the copy bandwidth.
// Here each block keeps a ring of S stages (S = 2..4, as many as its share of the SM's shared
// memory holds); a stage holds one row's x and dy (fused: residual and ds too), one 1-D bulk copy
// a tensor, all completing on the stage's mbarrier (Note [bulk copies] in cuda_launch.cuh).
//  - Thread 0 issues the copies. Every thread waits on the stage's barrier with the parity of its
//    turn, reads its own 16-byte packs, and reduces (sum x^2, sum m*x) over the block (Note
//    [reduce-scatter block sum]: one barrier; against two barriers and two full butterflies,
//    rms_norm_backward bf16 110.4 -> 109.3 us at 16,384 x 4,096, round 21). After that
//    reduction (whose block barrier follows every thread's work on the previous row) thread 0
//    refills the previous row's stage, so S - 1 rows are in flight while a row is reduced and
//    written; the copies take no registers and no issue slots of the other threads.
//  - The packs are read again from shared memory for dx rather than held across the reduction,
//    which leaves the registers for w + offset in f32 (one conversion and add an element fewer in
//    each of the row's two passes). K packs a thread, 512 threads x 1 or 2 (hidden up to 8,192
//    bf16, 4,096 f32); dw accumulates in f32 registers over the block's rows; one
//    cooperative launch whose blocks write dw partials [G, hidden], meet at a grid barrier and
//    sum them in a fixed order (Note [one-launch dw], Note [deterministic dw]): the same bits for
//    a given shape and device, no float atomics.
//  - Taken from 16 rows an SM on, 4 with the residual (below, a block has too few rows to fill
//    its ring: rms_norm_backward at 1,024 rows ran at 14.5 us against 14.0 for the
//    register-resident kernel, while fused_add_rms_norm_backward f32 gained, 37.3 -> 31.3 us),
//    and not for f32 without the residual (measured slower, launch_bwd_bulk). H200, 16,384 x
//    4,096, % of copy, this pipeline against the register-resident kernel in the same call:
//    rms_norm_backward bf16 83.7% / 69%, f16 83.9% / 71%; fused_add_rms_norm_backward bf16 86% /
//    85%, f16 87% / 86.5%, f32 95% / 82% (docs/perf/gpu-h200-2026-11-28-round18.md; rows in
//    chunks). 256 threads x 2 packs was slower (77%).
//  - Rows in the strided order of Note [row order] (cuda_backward.cuh): block b takes b, b + G,
//    ..., so the blocks read neighbouring rows at any one time. Against chunks of rows in one
//    call: rms_norm_backward bf16 114.2 -> 110.1 us (84.0% -> 87.0-87.4% of copy),
//    fused_add_rms_norm_backward bf16 222.4 -> 219.1 (docs/perf/gpu-h200-2026-11-28-round19.md).
//  - Assumes what the vec16 predicate checks: every row 16-byte aligned (base and stride) and
//    hidden a multiple of the 16-byte pack, so a row is a whole number of 16-byte units, as a bulk
//    copy needs. With less than two stages' room the caller runs the register-resident kernel.
//  - dx (and dresidual) leave with streaming stores (Note [streaming stores] in cuda_launch.cuh):
//    H200, same call, two rounds, fused_add_rms_norm_backward 16,384 x 4,096 bf16 217.1 -> 214.3 /
//    213.9 us (88.4% -> 90.1 / 89.6% of copy), f16 215.5 -> 213.4 / 212.9, 1,024 tokens bf16
//    20.5 / 19.6 -> 18.2 / 17.3 us; rms_norm_backward bf16 unchanged (109.6 / 109.3 against 109.9 /
//    109.9), f16 115.8 / 115.4 -> 114.4 / 114.1 (docs/perf/gpu-h200-2026-11-29-round24.md).
//  - Note [pipeline row pairs]: where the ring holds four stages (x and dy of a 16-bit row of
//    4,096; not with the residual, whose stages are twice the size), a block takes its rows two at
//    a time:
//    both rows' sums in one block reduction (block_sum_once<4>), then both rows' dx, and the two
//    stages of the previous pair refilled together. Per row that halves the reduction's barrier
//    and shuffles, the stage waits and the loop's bookkeeping, which the profile of round 21 put
//    beside the element math as what bounds the kernel (the warps of a block idle together at
//    each row's barrier). H200, bf16 16,384 x 4,096, pairs off / on in one call
//    (docs/perf/gpu-h200-2026-12-01-round35.md): rms_norm_backward 109.6 -> 105.9 us (87.4% ->
//    90.4% of copy), gemma_rms_norm_backward 109.5 -> 106.1 (87.4% -> 90.3%); the same pairs in
//    layer_norm_backward's pipeline ran slower (125.8 -> 128.0) and are not used there.
//    OPFORGE_CUDA_NORM_PAIRS=0 takes one row at a time (side-by-side timing).
//  - One row a turn in bf16 (the residual's stages, or a ring of fewer than four) keeps the row's
//    packs in registers from the sums to dx and refills its stage right after the reduction (Note
//    [held row], cuda_backward.cuh): fused_add_rms_norm_backward bf16 1,024 x 4,096 16.6 -> 16.1 us.
//  - OPFORGE_CUDA_NORM_BULK=0 turns the pipeline off (side-by-side timing, and checks of the
//    register-resident kernel at many rows).
// f32 arithmetic, int64 row offsets, launches on ctx.stream, no host synchronization.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "ops/norm/cuda_backward.cuh"

namespace opforge::cuda::norm {
namespace {

// Rows per SM from which the pipeline is taken: 16 for rms_norm_backward, 4 with the residual.
// H200, hidden 4,096, 1,024 rows (7.75 an SM), pipeline against the register-resident kernel in
// one call (docs/perf/gpu-h200-2026-11-28-round19.md): rms_norm_backward bf16 14.45 / 13.97 us;
// fused_add_rms_norm_backward f32 31.3 / 37.3, bf16 20.2 / 20.6.
constexpr int64_t kBulkMinRowsPerSm = 16;
constexpr int64_t kBulkMinRowsPerSmFused = 4;

// R: rows a turn (Note [pipeline row pairs]: 1 or 2; two share one block reduction and need 2R stages).
// kHold: Note [held row] (cuda_backward.cuh), the row's packs kept in registers from the sums to dx
// (one row a turn only).
template <class T, int K, bool kFused, int R, bool kHold>
__global__ void __launch_bounds__(kBwdMaxThreads, K == 1 ? 2 : 1)
    rms_norm_bwd_bulk_kernel(BwdArgs<T> a, float* partial, int64_t rows_per_block, bool strided,
                             int stages, unsigned* barrier, T* dw_out, int64_t dw_stride) {
  static_assert(!kHold || R == 1, "row pairs re-read their stages");
  constexpr int N = Pack<T>::n;
  constexpr int kTensors = kFused ? 4 : 2;  // x, dy (, residual, ds) of a row
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kBulkMaxStages];
  __shared__ float scratch[2 * 2 * R * 32];
  __shared__ float slice[kBwdMaxThreads];
  unsigned turn = 0;  // block_sum_once's scratch half
  const int n_packs = int(a.hidden / N);
  const int threads = blockDim.x;
  const uint32_t row_bytes = uint32_t(a.hidden) * uint32_t(sizeof(T));
  const uint32_t stage_bytes = kTensors * row_bytes;
  const BlockRows rows = block_rows(a.rows, rows_per_block, strided);  // Note [row order]
  programmatic_prologue();  // Note [programmatic launch]

  // Thread 0: the bulk copies of `row` into stage s (none past the block's rows).
  auto issue = [&](int64_t row, int s) {
    if (row >= rows.end) return;
    unsigned char* dst = ring + size_t(s) * stage_bytes;
    if constexpr (kFused) {
      const T* const src[4] = {a.x + row * a.x_stride, a.dy + row * a.dy_stride, a.r + row * a.r_stride,
                               a.ds + row * a.ds_stride};
      fill_stage(dst, &full[s], row_bytes, src);
    } else {
      const T* const src[2] = {a.x + row * a.x_stride, a.dy + row * a.dy_stride};
      fill_stage(dst, &full[s], row_bytes, src);
    }
  };
  start_ring(full, stages, rows, issue);

  // w + offset in f32 for the whole chunk (the registers the packs of x and dy do not hold).
  float wf[K][N];
  float dw[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * threads;
    if (i < n_packs) {
      const Pack<T> wp = load_pack_readonly(a.w + i * N);
#pragma unroll
      for (int j = 0; j < N; ++j) wf[k][j] = to_f32(wp.v[j]) + a.offset;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = 0.0f;
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  // This thread's packs of the row in `stage`: x (fused: rounded x + residual), dy and ds.
  auto read = [&](const unsigned char* stage, int k, Pack<T>& xp, Pack<T>& gp, Pack<T>& dsp) {
    const uint32_t off = uint32_t(threadIdx.x + k * threads) * 16u;
    xp = stage_pack<T>(stage, off);
    gp = stage_pack<T>(stage, row_bytes + off);
    if constexpr (kFused) {
      xp = rounded_sum(xp, stage_pack<T>(stage, 2 * row_bytes + off));
      dsp = stage_pack<T>(stage, 3 * row_bytes + off);
    }
  };

  // A stage's index for s in (-stages, 2 * stages).
  auto stage_index = [&](int i) { return i < 0 ? i + stages : i >= stages ? i - stages : i; };
  int s = 0;
  unsigned parity = 0;
  // The turn's rows are the block's rows n, ..., n + R - 1 (row n in stage s with parity `parity`).
  for (int64_t row = rows.begin; row < rows.end; row += R * rows.step) {  // block-uniform
    const unsigned char* stage[R];
    bool live[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      live[r] = r == 0 || row + r * rows.step < rows.end;  // block-uniform
      int sr = s + r;
      unsigned pr = parity;
      if (r > 0 && sr >= stages) sr -= stages, pr ^= 1u;
      stage[r] = ring + size_t(sr) * stage_bytes;
      if (live[r]) bulk_wait(&full[sr], pr);
    }
    Pack<T> xp[K], gp[K], dsp[K];
    float sums[2 * R];  // (sum x^2, sum m*x) of row r at 2r
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sums[2 * r] = sums[2 * r + 1] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (live[r] && threadIdx.x + k * threads < n_packs) {
          read(stage[r], k, xp[k], gp[k], dsp[k]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float v = to_f32(xp[k].v[j]);
            const float m = to_f32(gp[k].v[j]) * wf[k][j];
            sums[2 * r] += v * v;
            sums[2 * r + 1] += m * v;
          }
        }
      }
    }
    block_sum_once<2 * R>(sums, scratch, turn);
    // Every thread has finished the previous turn's rows, whose stages it read last (the
    // reduction's block barrier): refill those stages, `stages` rows ahead of what they held.
    // This turn's stages are read again for dx below; holding its packs, they are refilled now.
    if constexpr (kHold) {
      if (threadIdx.x == 0)
#pragma unroll
        for (int r = 0; r < R; ++r) issue(row + (stages + r) * rows.step, stage_index(s + r));
    } else if (threadIdx.x == 0 && row != rows.begin) {
#pragma unroll
      for (int r = 0; r < R; ++r) issue(row + (stages - R + r) * rows.step, stage_index(s - R + r));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!live[r]) continue;
      const BwdRow<T> p = bwd_row<T, kFused>(a, row + r * rows.step);
      const float2 scale = row_scales(make_float2(sums[2 * r], sums[2 * r + 1]), a);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = threadIdx.x + k * threads;
        if (i >= n_packs) continue;
        if constexpr (!kHold) read(stage[r], k, xp[k], gp[k], dsp[k]);  // again: not held
        Pack<T> out;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float v = to_f32(xp[k].v[j]), g = to_f32(gp[k].v[j]);
          float dx = scale.x * g * wf[k][j] - scale.y * v;
          if constexpr (kFused) dx += to_f32(dsp[k].v[j]);
          out.v[j] = from_f32<T>(dx);
          dw[k][j] += g * v * scale.x;
        }
        store_pack_streaming(p.dx + i * N, out);  // Note [streaming stores]
        if constexpr (kFused) store_pack_streaming(p.dr + i * N, out);
      }
    }
    s += R;
    if (s >= stages) s -= stages, parity ^= 1u;
  }

  store_partial_row<T, K>(partial + int64_t(blockIdx.x) * a.hidden, a.hidden, dw);
  grid_barrier(barrier, gridDim.x);
  dw_from_partials(partial, a.hidden, slice, dw_out, dw_stride);
}

template <class T, int K, bool kFused, int R, bool kHold>
bool launch_k(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, int block) {
  auto kernel = rms_norm_bwd_bulk_kernel<T, K, kFused, R, kHold>;
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  constexpr int kTensors = kFused ? 4 : 2;
  // A block's share of the SM: half at K = 1 (two blocks of 512 threads at 64 registers), all of
  // it at K = 2.
  static BulkCache cache;
  BulkPlan plan;
  if (!plan_bulk(kernel, cache, props, kTensors * a.hidden * int64_t(sizeof(T)), K == 1 ? 2 : 1, block, plan) ||
      plan.stages < 2 * R)
    return false;
  const OneLaunchGrid g = one_launch_grid(a.rows, a.hidden, plan.resident, block);
  auto* partial = static_cast<float*>(cuda_workspace(ctx, g.blocks * a.hidden * int64_t(sizeof(float))));
  unsigned* barrier = cuda_grid_barrier(ctx);
  launch_cooperative(ctx,
                     kFused ? "fused_add_rms_norm_backward_cuda_vec16 bulk-copy launch"
                            : "rms_norm_backward_cuda_vec16 bulk-copy launch",
                     kernel, g.blocks, block, size_t(plan.smem), a, partial, g.rows_per_block,
                     bulk_rows_strided(), plan.stages, barrier, dw.ptr<T>(), int64_t(dw.stride(0)));
  return true;
}

}  // namespace

template <class T, bool kFused>
bool launch_bwd_bulk(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw) {
  // f32 rms_norm_backward stays register-resident: at 16,384 x 4,096 on an H200 it reached 93-94%
  // of copy there against 89-91% here (two packs a thread, one block an SM), in three calls.
  if constexpr (std::is_same_v<T, float> && !kFused) {
    return false;
  } else {
    static const bool off = env_off("OPFORGE_CUDA_NORM_BULK");
    const int64_t min_rows = bulk_min_rows_per_sm(kFused ? kBulkMinRowsPerSmFused : kBulkMinRowsPerSm);
    if (off || a.rows < min_rows * int64_t(cuda_device_props(ctx.device.index).sm_count))
      return false;
    const RowShape shape = register_row_shape(a.hidden / Pack<T>::n, kBwdMaxThreads, 0);
    static const bool pairs = !env_off("OPFORGE_CUDA_NORM_PAIRS");  // Note [pipeline row pairs]
    if (shape.k == 1) {
      if (pairs && launch_k<T, 1, kFused, 2, false>(ctx, a, dw, shape.block)) return true;
      if constexpr (sizeof(T) == 2) {
        if (hold_row<T>()) return launch_k<T, 1, kFused, 1, true>(ctx, a, dw, shape.block);
      }
      return launch_k<T, 1, kFused, 1, false>(ctx, a, dw, shape.block);
    }
    return launch_k<T, 2, kFused, 1, false>(ctx, a, dw, shape.block);
  }
}

#define OPFORGE_BWD_BULK(T)                                                                       \
  template bool launch_bwd_bulk<T, false>(const Context&, const BwdArgs<T>&, const TensorView&); \
  template bool launch_bwd_bulk<T, true>(const Context&, const BwdArgs<T>&, const TensorView&);
OPFORGE_BWD_BULK(float)
OPFORGE_BWD_BULK(__half)
OPFORGE_BWD_BULK(__nv_bfloat16)
#undef OPFORGE_BWD_BULK

}  // namespace opforge::cuda::norm
