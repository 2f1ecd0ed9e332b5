// CUDA kernels of cross_entropy and cross_entropy_backward (math: the ops' docs, ops/loss/loss.h).
//
// Technique. Both are memory-bound on the [N, V] logits (V up to 152k): the ideal reads the
// logits once in the forward, and reads them once and writes dlogits once in the backward.
//  - Forward: the threads of a row (a warp for short rows, up to 256 for long ones, as in
//    ops/softmax/cuda.cu) read the row once, keeping online (max, sum of exp(z - max)) and, with
//    label smoothing, sum(z); z = softcap * tanh(x / softcap) is applied on the fly. One thread
//    of the row then reads z[target] (a single element), and writes lse and the row's loss.
//    Each thread keeps four 16-byte loads in flight (scan_units). With fewer rows than SMs a row
//    is split over several blocks and their partial statistics merged by a second launch
//    (Note [split rows]): 16 rows of a 128k vocab then use the whole card, not 16 SMs. With
//    16-byte packs a row is `ranks` blocks whose partials the last block to finish merges (sum /
//    mean: Note [few-row cross_entropy gather]) or, on compute capability 9.0 and for reduction
//    none, one thread-block cluster (Note [few-row cross_entropy cluster]); where the row kernel
//    would leave SMs without a block, the rows stream through shared memory instead (Note
//    [cross_entropy row pipeline], ops/loss/cuda_pipeline.cu).
//    Reductions run in a fixed order (ops/softmax/row_reduce.cuh), so results are deterministic.
//  - sum / mean: the per-row losses go to the stream's workspace and one more launch of one
//    block adds them in a fixed order (Note [loss row reduction]: strided f64 sums, then a tree), and
//    counts the rows not ignored: no atomics, no host synchronization (no `.item()`).
//  - Backward: needs no reduction (p = exp(z - lse) from the saved lse), so it is one streaming
//    pass: 2-D blocks, x over the row's 16-byte packs (or elements), y over rows; each thread
//    writes 1, 2 or 4 units of a row (Note [backward units]), dz = g ((1 + 2 s lse) p - eps -
//    (1 - ls) [j == target]) times the softcap's derivative, one FFMA after the exp when there is
//    no softcap. The target entry is computed in f32 like every other. For mean, a one-block
//    launch first counts the kept rows into the workspace (up to 64 rows every block counts them
//    itself, with no launch before it).
//  - cuda_vec16 (priority 200): 16-byte packs, needs aligned bases and V, row strides multiples
//    of the pack; cuda (priority 100): single elements, any layout the check accepts.
//  - lse and dloss are read in whatever floating dtype they have; loss and lse are written as f32.
//  - int64 offsets throughout (row * row_stride), exp per Note [element exp]
//    (ops/softmax/row_reduce.cuh), accurate logf / tanhf.
// Differs from the CPU kernels in one way: a target outside [0, V) that is not ignore_index cannot
// be reported without a host synchronization, so the CUDA check skips the range scan (as for
// every device tensor) and the kernel writes NaN for that row's loss (and NaN gradients).
#include <algorithm>
#include <cmath>
#include <string_view>

#include <cooperative_groups.h>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/ce_forward.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"
#include "ops/softmax/cluster_plan.h"
#include "ops/softmax/cluster_row.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge {
namespace cuda::loss {
namespace {

namespace cg = cooperative_groups;
using namespace cuda::rows;  // NOLINT: UnitOf, Stats, row_stats, row_sum

enum class Red { none, sum, mean };
Red red_of(std::string_view r) { return r == "none" ? Red::none : r == "sum" ? Red::sum : Red::mean; }

constexpr int kSplitBlock = 256;  // threads of a split-row block (Note [split rows])

// Note [row threads]: the row kernel gives a row the fewest threads (a power of two, 32 to 256)
// that leave each at most kRowUnits units. 32 rather than 8 halves the blocks where rows are
// 2,049-8,192 units long: H200, bf16, 1,024 x 32,000 (4,000 packs) 128 threads a row, two rows a
// block, 512 blocks, about one wave at four blocks an SM: 22.2 us against 24.2 with 256 threads
// (1,024 blocks, two waves), 25.7 with 64 (docs/perf/gpu-h200-2026-11-30-round29.md); 1,024 and
// 8,192 x 128,256 take 256 threads either way. OPFORGE_CUDA_CE_ROW_UNITS overrides it (tuning).
constexpr int64_t kRowUnits = 32;

// Note [plain row scan]: the 16-byte-pack row kernel is instantiated twice. Calls with no softcap
// and no label smoothing (kPlain) scan without the per-element cap and sum(z), and their last
// partial batch of loads is issued together (kGuardedTail; a thread of 31 units had run seven
// batches of four, then three round trips of one); calls with either option, and the scalar
// kernel, keep the general scan with the tail a unit at a time. H200, same binary,
// OPFORGE_CUDA_CE_PLAIN=0 (the general kernel for every call) -> default, two repetitions, us:
// bf16 1,024 x 32,000 22.18 / 22.20 -> 21.22 / 21.16 (71% -> 74% of copy), 1,024 x 128,256
// 69.96 / 69.97 -> 67.69 / 67.70 (90% -> 93%), 8,192 x 128,256 481.5 / 481.7 -> 468.6 / 468.7;
// f32 1,024 x 32,000 40.50 / 40.53 -> 38.73 / 38.70, f16 22.30 / 22.19 -> 20.96 / 21.00. The plain
// scan with the unit-at-a-time tail was slower at 1,024 x 128,256; prefetching the next batch and
// eight loads a batch were slower too (docs/perf/gpu-h200-2026-12-01-round34.md).
template <class T, bool kVec, bool kPlain = false>
__global__ void __launch_bounds__(256) forward_kernel(ForwardArgs<T> p, int rt) {
  programmatic_prologue();  // Note [programmatic launch]
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  const int64_t units = p.vocab / UnitOf<T, kVec>::width;
  const int rows_per_block = int(blockDim.x) / rt;
  const int64_t tid = int(threadIdx.x) % rt;
  const int64_t row_step = int64_t(gridDim.x) * rows_per_block;
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < p.rows; base += row_step) {
    const int64_t row = base + int(threadIdx.x) / rt;
    const bool live = row < p.rows;
    Stats st{-INFINITY, 0.0f};
    float sum_z = 0.0f;
    if (live) scan_units<T, kVec, kPlain, kPlain>(p.logits + row * p.logits_stride, tid, units, rt, p.o.softcap, st, sum_z);
    st = row_stats<T>(st, rt, stats_scratch);
    if (p.o.smoothing > 0.0f) sum_z = row_sum(sum_z, rt, sum_scratch);
    if (live && tid == 0) {
      int64_t t;
      float zt;
      load_target(p, row, t, zt);
      finish_row(p, row, st, sum_z, t, zt);
    }
  }
}

// Note [split rows]: with few rows (fewer blocks than SMs), one block per row leaves most of the
// card idle and each thread waits out dozens of dependent loads. Then a row is cut into `splits`
// segments of `seg_units` units, one block of 256 threads each, which leave (max, sum of exp,
// sum z) per segment in the workspace; the last block to finish merges them (finish_split_rows).
template <class T>
__device__ void finish_split_rows(const ForwardArgs<T>& p, int64_t splits, const float* partials, int red,
                                  float* reduced);

template <class T, bool kVec>
__global__ void __launch_bounds__(256) forward_split_kernel(ForwardArgs<T> p, int64_t splits, int64_t seg_units,
                                                            float* partials, unsigned* arrivals, int red,
                                                            float* reduced) {
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  const int64_t units = p.vocab / UnitOf<T, kVec>::width;
  const int64_t row = int64_t(blockIdx.x) / splits, seg = int64_t(blockIdx.x) % splits;
  const int64_t end = min(units, (seg + 1) * seg_units);
  Stats st{-INFINITY, 0.0f};
  float sum_z = 0.0f;
  scan_units<T, kVec, true>(p.logits + row * p.logits_stride, seg * seg_units + threadIdx.x, end, blockDim.x,
                      p.o.softcap, st, sum_z);
  st = row_stats<T>(st, int(blockDim.x), stats_scratch);
  if (p.o.smoothing > 0.0f) sum_z = row_sum(sum_z, int(blockDim.x), sum_scratch);
  if (threadIdx.x == 0) {
    float* out = partials + 3 * (row * splits + seg);
    out[0] = st.m, out[1] = st.s, out[2] = sum_z;
  }
  if (last_block_arrives(arrivals, gridDim.x)) finish_split_rows(p, splits, partials, red, reduced);
}

// sum (red 1) or mean (red 2) of a last block's rows' losses, staged in its shared memory (row_loss,
// row_kept; after a block barrier): the first warp adds them in f64 in a fixed order (lane l: rows
// l, l + 32, ...; then a butterfly every lane runs identically), the same bits every run. A mean
// of no kept row is NaN, as the reference's. The other warps return at once.
__device__ void add_row_losses(const float* row_loss, const bool* row_kept, int64_t rows, int red, float* reduced) {
  if (threadIdx.x >= 32) return;
  double sum = 0, kept = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 32) {
    sum += double(row_loss[r]);
    kept += row_kept[r] ? 1.0 : 0.0;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    kept += __shfl_xor_sync(0xffffffffu, kept, offset);
  }
  if (threadIdx.x == 0) *reduced = float(red == 1 ? sum : sum / kept);
}

// The split kernel's last block (Note [last block]) finishes every row: the segments' partials are
// staged through shared memory by all its threads (parallel loads, not one chain per row), thread r
// merges row r's segments in segment order and finishes the row, and for sum / mean the first warp
// adds the rows' losses in f64 in a fixed order (lane l: rows l, l + 32, ...; then a butterfly
// every lane runs identically): one launch in all, the same bits every run. rows <= blockDim.x.
template <class T>
__device__ void finish_split_rows(const ForwardArgs<T>& p, int64_t splits, const float* partials, int red,
                                  float* reduced) {
  constexpr int kStage = 1024;
  __shared__ float stage[3 * kStage];
  __shared__ float row_loss[kSplitBlock];
  __shared__ bool row_kept[kSplitBlock];
  const int64_t row = threadIdx.x, total = p.rows * splits;
  int64_t t = 0;
  float zt = 0.0f;
  if (row < p.rows) load_target(p, row, t, zt);  // in flight while the partials are staged
  Stats st{-INFINITY, 0.0f};
  float sum_z = 0.0f;
  for (int64_t base = 0; base < total; base += kStage) {
    const int64_t n = min(int64_t(kStage), total - base);
    for (int64_t i = threadIdx.x; i < 3 * n; i += blockDim.x) stage[i] = __ldcg(partials + 3 * base + i);
    __syncthreads();
    if (row < p.rows) {
      const int64_t lo = max(base, row * splits), hi = min(base + n, (row + 1) * splits);
      if (lo < hi) {  // this stage's segments of the row, Note [max first] (row_reduce.cuh)
        float m = -INFINITY, s = 0.0f;
        for (int64_t e = lo; e < hi; ++e) m = fmaxf(m, stage[3 * (e - base)]);
        for (int64_t e = lo; e < hi; ++e) {
          const float* in = stage + 3 * (e - base);
          s += rescaled(Stats{in[0], in[1]}, m);
          sum_z += in[2];
        }
        st = merge(st, Stats{m, m == -INFINITY ? 0.0f : s});
      }
    }
    __syncthreads();
  }
  if (row < p.rows) {
    row_loss[row] = finish_row(p, row, st, sum_z, t, zt);
    row_kept[row] = t != p.o.ignore_index;
  }
  if (red == 0) return;
  __syncthreads();
  add_row_losses(row_loss, row_kept, p.rows, red, reduced);
}

// Note [few-row cross_entropy cluster] (16-byte packs, compute capability 9.0 on; Note [cluster
// launch]; reduction none, and sum / mean with OPFORGE_CUDA_CE_GATHER=0, Note [few-row
// cross_entropy gather]): Note [split rows] as one thread-block cluster a row, with the softmax
// family's plan (few_row_plan, ops/softmax/cluster_plan.h: `ranks` CTAs of 256 threads a row, 4 or
// 8 units a thread; 2 where they hold the CTA's segment, held_units: H200, bf16 16 x 4,096 none
// 2.76 -> 2.51 us, docs/perf/gpu-h200-2026-12-02-round37.md). Every thread loads all its units of
// the row at once (one memory round trip, where the split kernel's four-in-flight loop waits out
// two or more), takes its (max, sum of exp) as
// pairwise trees (cached_stats) and the CTA's (max, sum, sum z) goes to its shared memory. After
// one cluster barrier rank 0 fetches the cluster's partials through distributed shared memory (a
// thread per rank), thread 0 merges them in rank order and finishes the row (lse, loss), its
// target and target logit loaded while the row was. sum / mean: the rows' rank-0 CTAs arrive on
// the stream's barrier word (Note [last block]) and the last one adds the rows' losses (Note
// [loss row reduction]); a mean's kept rows are counted by every rank-0 CTA from labels loaded
// with the row, so the last one reads only the losses after it arrives. One launch, no workspace
// for partials, the same bits every run.
// Only below the SM count: with more rows the cluster a row (Note [many-row cluster]) was 2.1-2.3x
// slower than the row kernel on an H200 (bf16 1,024 x 128,256: 145 against 70 us; 8,192 x
// 128,256: 1,126 against 481), unlike the softmax family's.
constexpr int kMaxClusterRanks = 8;  // the portable cluster size

template <class T, int kUnits>
__global__ void __launch_bounds__(softmax::kClusterThreads, 2)
    forward_cluster_kernel(ForwardArgs<T> p, int64_t seg_units, unsigned* arrivals, RowReduce reduce) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, true>;
  constexpr int W = U::width, kThreads = softmax::kClusterThreads;
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  __shared__ Stats part;  // this CTA's statistics and sum of z, read by rank 0
  __shared__ float part_z;
  __shared__ Stats parts[kMaxClusterRanks];  // rank 0: the cluster's, in rank order
  __shared__ float parts_z[kMaxClusterRanks];
  cg::cluster_group cluster = cg::this_cluster();
  const ClusterRow seg = cluster_row(cluster, p.vocab / W, seg_units);
  const unsigned rank = seg.rank, ranks = seg.ranks;
  const int64_t row = seg.row;
  const T* x = p.logits + row * p.logits_stride;
  typename U::Raw raw[kUnits];
  load_segment<U, kUnits, kThreads>(x, seg, -INFINITY, raw);
  const bool finisher = rank == 0 && threadIdx.x == 0;
  int64_t t = 0;
  float zt = 0.0f;
  if (finisher) load_target(p, row, t, zt);  // in flight with the row
  // A mean's kept rows, counted by the rank-0 CTAs from labels loaded now (one a thread: rows <=
  // kThreads here), so that the last CTA's reduction reads only the losses after its arrival.
  const bool count_here = reduce.out != nullptr && reduce.divide && reduce.labels != nullptr && p.rows <= kThreads;
  const bool kept_mine = count_here && rank == 0 && threadIdx.x < p.rows &&
                         reduce.labels[int64_t(threadIdx.x) * reduce.labels_stride] != reduce.ignore_index;
  float v[kUnits][W], zs[kUnits];
  widen_segment<U, kUnits, kThreads, true>(raw, seg, p.o.softcap, v, zs);
  Stats st = cached_stats<T, false>(v);
  st = row_stats<T>(st, kThreads, stats_scratch);
  if (p.o.smoothing > 0.0f) {  // uniform over the launch
    const float z = row_sum(tree_reduce(zs, [](float a, float b) { return a + b; }), kThreads, sum_scratch);
    if (threadIdx.x == 0) part_z = z;
  }
  if (threadIdx.x == 0) part = st;
  cluster.sync();
  if (rank == 0 && threadIdx.x < ranks) {
    parts[threadIdx.x] = *cluster.map_shared_rank(&part, threadIdx.x);
    if (p.o.smoothing > 0.0f) parts_z[threadIdx.x] = *cluster.map_shared_rank(&part_z, threadIdx.x);
  }
  cluster_arrive();  // done with the other CTAs' shared memory
  if (rank == 0) {   // the whole CTA (barriers below)
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum_z = 0.0f;
      if (p.o.smoothing > 0.0f)
        for (unsigned r = 0; r < ranks; ++r) sum_z += parts_z[r];
      finish_row(p, row, merge_all<T>(parts, int(ranks)), sum_z, t, zt);
    }
    if (reduce.out != nullptr) {
      const float kept = count_here ? float(__syncthreads_count(kept_mine)) : -1.0f;
      if (last_block_arrives(arrivals, unsigned(p.rows))) reduce_rows_in_block<kThreads>(reduce, kept);
    }
    __syncwarp();
  }
  cluster_wait();  // no CTA leaves while rank 0 may still read its `part`
}

// Launches Note [few-row cross_entropy cluster] when its plan takes the call and the device can
// co-schedule the cluster; false otherwise (the caller takes the split or row kernel).
template <class T>
bool launch_forward_cluster(const Context& ctx, const ForwardArgs<T>& p, int64_t units, int sms, unsigned* arrivals,
                            const RowReduce& reduce) {
  if (!cluster_rows_enabled()) return false;
  softmax::FewRowPlan plan = softmax::few_row_plan(p.rows, units, sms, true);
  if (plan.ranks > kMaxClusterRanks) plan = softmax::few_row_plan(p.rows, units, sms, false);
  if (plan.ranks < 2) return false;
  auto launch = [&](auto kernel) {
    if (!cluster_launch_fits(ctx.device.index, reinterpret_cast<const void*>(kernel), plan.ranks,
                             softmax::kClusterThreads, 0))
      return false;
    launch_cluster(ctx, "cross_entropy cluster launch", kernel, dim3(unsigned(p.rows * plan.ranks)),
                   dim3(softmax::kClusterThreads), 0, plan.ranks, p, (units + plan.ranks - 1) / plan.ranks, arrivals,
                   reduce);
    return true;
  };
  const int held = softmax::held_units(plan, units);
  return held == 2   ? launch(forward_cluster_kernel<T, 2>)
         : held == 4 ? launch(forward_cluster_kernel<T, 4>)
                     : launch(forward_cluster_kernel<T, 8>);
}

// Note [few-row cross_entropy gather] (16-byte packs, sum / mean): Note [few-row cross_entropy
// cluster]'s plan and row scan in a plain launch: a row is `ranks` consecutive blocks (up to 16),
// each of which loads all its units at once (2, 4 or 8 a thread: the fewest that hold its segment,
// so no thread carries dead units through the math) and leaves its (max, sum of exp, sum z) in
// the workspace, rank 0 with the target's logit beside them (loaded while the row is). The last
// block to arrive (Note [last block]) finishes every row at once: thread i loads partial i, the
// `ranks` lanes of a row merge them by butterflies (max first, then the rescaled sums; the same
// tree every run), the row's first lane writes lse and the loss, and the first warp adds the
// rows' losses (add_row_losses). Where the cluster kernel met its cluster at a barrier, read the
// partials through distributed shared memory, finished each row in its rank-0 CTA and then sent
// those CTAs to a second arrival and a second round trip for the losses, one arrival and one
// batch of loads do it all. H200, bf16, same binary with OPFORGE_CUDA_CE_GATHER=0 (the cluster
// kernel) -> default, us: 16 x 32,000 mean 4.91 -> 3.76, 16 x 128,256 6.20 -> 4.91, 16 x 32,000
// with every option 7.27 -> 5.06, 8 x 40,000 (16 blocks a row) 5.45 -> 3.77 (2 units a thread
// instead of 4 took 0.2 us of the 16 x 32,000 figure; docs/perf/gpu-h200-2026-12-02-round37.md).
// Reduction none keeps the cluster kernel, which needs no arrival there (24 x 20,000: 2.99
// against 3.59 us). rows <= kSplitBlock.
template <class T, int kUnits>
__global__ void __launch_bounds__(softmax::kClusterThreads, 2)
    forward_gather_kernel(ForwardArgs<T> p, int ranks, int64_t seg_units, float4* parts, unsigned* arrivals, int red,
                          float* reduced) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, true>;
  constexpr int W = U::width, kThreads = softmax::kClusterThreads;
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  const ClusterRow seg = grid_row(unsigned(ranks), p.vocab / W, seg_units);
  typename U::Raw raw[kUnits];
  load_segment<U, kUnits, kThreads>(p.logits + seg.row * p.logits_stride, seg, -INFINITY, raw);
  float zt = 0.0f;
  if (seg.rank == 0 && threadIdx.x == 0) {  // in flight with the row
    int64_t t;
    load_target(p, seg.row, t, zt);
  }
  float v[kUnits][W], zs[kUnits];
  widen_segment<U, kUnits, kThreads, true>(raw, seg, p.o.softcap, v, zs);
  const Stats st = row_stats<T>(cached_stats<T, false>(v), kThreads, stats_scratch);
  float sum_z = 0.0f;
  if (p.o.smoothing > 0.0f)  // uniform over the launch
    sum_z = row_sum(tree_reduce(zs, [](float a, float b) { return a + b; }), kThreads, sum_scratch);
  if (threadIdx.x == 0) parts[blockIdx.x] = make_float4(st.m, st.s, sum_z, zt);
  if (!last_block_arrives(arrivals, gridDim.x)) return;

  __shared__ float row_loss[kSplitBlock];
  __shared__ bool row_kept[kSplitBlock];
  const int64_t total = p.rows * ranks;
  for (int64_t base = 0; base < total; base += kThreads) {  // uniform: every lane reaches the shuffles
    const int64_t i = base + threadIdx.x;
    const bool lead = i < total && i % ranks == 0;
    const float4 q = i < total ? __ldcg(parts + i) : make_float4(-INFINITY, 0.0f, 0.0f, 0.0f);
    int64_t t = 0;
    if (lead) t = p.target[(i / ranks) * p.target_stride];  // issued with the partials' loads
    // A row's partials sit in `ranks` aligned lanes of one warp (ranks: a power of two <= 16).
    float m = q.x;
    for (int o = 1; o < ranks; o *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = m == -INFINITY ? 0.0f : rescaled<T>(Stats{q.x, q.y}, m), z = q.z;
    for (int o = 1; o < ranks; o *= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      z += __shfl_xor_sync(0xffffffffu, z, o);
    }
    if (lead) {
      const int64_t row = i / ranks;
      const float loss = finish_row(p, row, Stats{m, s}, z, t, q.w);
      row_loss[row] = loss;
      row_kept[row] = t != p.o.ignore_index;
    }
  }
  if (red == 0) return;
  __syncthreads();
  add_row_losses(row_loss, row_kept, p.rows, red, reduced);
}

// Note [few-row cross_entropy gather]'s plan ({0, 0}: not taken; any compute capability, no
// cluster) and launch (`parts`: rows * ranks float4 of workspace).
inline softmax::FewRowPlan gather_plan(int64_t rows, int64_t units, int sms) {
  if (rows > kSplitBlock) return {};
  const softmax::FewRowPlan plan = softmax::few_row_plan(rows, units, sms, true);
  return plan.ranks >= 2 ? plan : softmax::FewRowPlan{};
}
// The gather plan forward() takes for a sum / mean of `rows` rows of `units` packs ({0, 0}: it
// does not; OPFORGE_CUDA_CE_GATHER=0 turns it off, side-by-side timing).
softmax::FewRowPlan forward_gather(int64_t rows, int64_t units, int sms) {
  static const bool on = !env_off("OPFORGE_CUDA_CE_GATHER");
  return on && rows < sms ? gather_plan(rows, units, sms) : softmax::FewRowPlan{};
}
template <class T>
void launch_forward_gather(const Context& ctx, const ForwardArgs<T>& p, int64_t units, const softmax::FewRowPlan& plan,
                           float4* parts, unsigned* arrivals, int red, float* reduced) {
  const int held = softmax::held_units(plan, units);
  auto kernel = held == 2   ? forward_gather_kernel<T, 2>
                : held == 4 ? forward_gather_kernel<T, 4>
                            : forward_gather_kernel<T, 8>;
  launch_programmatic(ctx, "cross_entropy gather launch", kernel, dim3(unsigned(p.rows * plan.ranks)),
                      dim3(softmax::kClusterThreads), 0, p, plan.ranks, (units + plan.ranks - 1) / plan.ranks, parts,
                      arrivals, red, reduced);
}

// Note [loss row reduction] (ops/loss/loss_cuda.cuh). For cross_entropy: labels = target,
// divisor_scale 1 (mean divides by the kept rows), count_only for the backward's mean.
__global__ void __launch_bounds__(1024) reduce_kernel(RowReduce r) {
  programmatic_prologue();  // Note [programmatic launch]
  reduce_rows_in_block<1024>(r);
}

__global__ void fill_kernel(float* out, float v) { *out = v; }

template <class T> struct BackwardArgs {
  T* dlogits;
  int64_t dlogits_stride;
  const T* logits;
  int64_t logits_stride, rows, vocab;
  const int64_t* target;
  int64_t target_stride;
  const void* lse;
  DType lse_dtype;
  int64_t lse_stride;
  const void* dloss;
  DType dloss_dtype;
  int64_t dloss_stride;  // 0 for sum / mean (one element)
  const float* kept;     // mean: the count of kept rows (workspace); else null
  bool count_in_block;   // mean with few rows: every block counts the kept rows itself (kept null)
  Options o;
};
// Mean over at most this many rows: the backward's blocks count the kept rows themselves (one
// target a thread and __syncthreads_count) instead of a one-block launch before them; 16 rows cost a
// block 16 small loads, which run in the shadow of its logits load.
constexpr int64_t kCountInBlockRows = 64;

// Note [backward units]: a thread writes kUnits units of a row (u0, u0 + bx, ...; bx = blockDim.x),
// their loads issued together, and reads the row's scalars (target, dloss, lse) once for all of
// them. One unit a thread made 1,024 x 128,256 bf16 16 million short threads, each paying the
// scalars, the mean's division and its block's launch for one 16-byte pack; and the element math
// is the exp and one FFMA (rows ignored or with a bad target branch off once, the target's term is
// a select of the FFMA's addend, the softcap a uniform branch), where it had been about 14
// instructions an element, enough to bound the bf16 kernel. H200, bf16, 1,024 x 128,256: 206 us
// (52%) before, 176 with 4 units alone, 134 (94%) with both.
template <class T, bool kVec, int kUnits>
__global__ void __launch_bounds__(256) backward_kernel(BackwardArgs<T> p) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  const int64_t units = p.vocab / W;
  const int64_t u0 = int64_t(blockIdx.x) * blockDim.x * kUnits + threadIdx.x;
  const int64_t first_row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  // The first row's loads (its units and scalars) are issued before anything waits: the kept-row
  // count below is a barrier over small dependent loads whose latency then overlaps them.
  typename U::Raw raw[kUnits];
  int64_t t = 0;
  float g = 0.0f, lse = 0.0f;
  auto load_row = [&](int64_t row) {
    const T* x = p.logits + row * p.logits_stride;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int64_t u = u0 + int64_t(k) * blockDim.x;
      if (u < units) raw[k] = U::load(x + u * W);
    }
    t = p.target[row * p.target_stride];
    g = load_float(p.dloss, p.dloss_dtype, row * p.dloss_stride);
    lse = load_float(p.lse, p.lse_dtype, row * p.lse_stride);
  };
  const bool live = u0 < units && first_row < p.rows;
  if (live) load_row(first_row);
  float inv_kept = 1.0f;
  if (p.count_in_block) {  // every thread of the block takes part (a barrier)
    const int64_t i = int64_t(threadIdx.y) * blockDim.x + threadIdx.x;
    inv_kept = 1.0f / float(__syncthreads_count(i < p.rows && p.target[i * p.target_stride] != p.o.ignore_index));
  } else if (p.kept) {
    inv_kept = 1.0f / *p.kept;
  }
  if (!live) return;  // no barriers below
  const float c_ls = 1.0f - p.o.smoothing, eps = p.o.smoothing / float(p.vocab);
  for (int64_t row = first_row; row < p.rows; row += row_step) {
    if (row != first_row) load_row(row);
    T* out = p.dlogits + row * p.dlogits_stride;
    // Ignored rows get 0, a target out of range NaN (the reference reports it; Note at the top).
    const bool ignored = t == p.o.ignore_index;
    if (ignored || t < 0 || t >= p.vocab) {
      typename U::Floats d;
#pragma unroll
      for (int j = 0; j < W; ++j) d.v[j] = ignored ? 0.0f : NAN;
#pragma unroll
      for (int k = 0; k < kUnits; ++k)
        if (const int64_t u = u0 + int64_t(k) * blockDim.x; u < units) U::store(out + u * W, d);
      continue;
    }
    // dz = g ((1 + 2 s lse) p - eps - (1 - ls) [j == target]) as one FFMA an element: a p + b,
    // b taking the target's term where j is the target (g / kept rows as a product: one rounding
    // more than the division, the same for every element).
    const float gr = g * inv_kept;
    const float a = gr * (1.0f + 2.0f * p.o.z_scale * lse), b = -gr * eps, b_hit = -gr * (eps + c_ls);
    const float lse2 = lse * kLog2e;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int64_t u = u0 + int64_t(k) * blockDim.x;
      if (u >= units) break;
      const typename U::Floats x = U::widen(raw[k]);
      const int64_t rel = t - u * W;
      const int hit = rel >= 0 && rel < W ? int(rel) : -1;  // the target's place in this unit
      typename U::Floats d;
      if (p.o.softcap > 0.0f) {  // uniform
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float z = cap(x.v[j], p.o.softcap), r = z / p.o.softcap;
          d.v[j] = fmaf(a, exp_shifted<T>(z, lse, lse2), hit == j ? b_hit : b) * (1.0f - r * r);
        }
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) d.v[j] = fmaf(a, exp_shifted<T>(x.v[j], lse, lse2), hit == j ? b_hit : b);
      }
      U::store(out + u * W, d);
    }
  }
}

Options options_of(int64_t ignore_index, double smoothing, double z_scale, double softcap) {
  return Options{ignore_index, float(smoothing), float(z_scale), float(softcap)};
}

template <bool kVec>
void forward(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& logits,
             const TensorView& target, const Options& o, Red red) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  DeviceGuard guard(ctx.device.index);
  cudaStream_t stream = stream_of(ctx);
  if (rows == 0) {  // sum of nothing is 0; mean of nothing is NaN (0 / 0), as in the reference
    if (red != Red::none) {
      fill_kernel<<<1, 1, 0, stream>>>(loss.ptr<float>(), red == Red::sum ? 0.0f : NAN);
      check_launch("cross_entropy fill launch");
    }
    return;
  }
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  // Note [split rows]: segments when one block per row would not give every SM a block, and the
  // rows are long enough that each of a segment's 256 threads still gets at least 2 units.
  constexpr int64_t kMinUnitsPerThread = 2;
  const int64_t units = vocab / (kVec ? 16 / logits.itemsize() : 1);  // 16-byte packs or elements
  int64_t splits = 1, seg_units = units;
  if (rows < props.sm_count && rows <= kSplitBlock) {
    // About one block per SM: at 16 x 128,256 bf16 on an H200, 8.5 us against 9.6-9.9 with two,
    // 10.8 with four or eight; 16 x 32,000 the same within 0.2 us (docs/perf/
    // gpu-h200-2026-11-27-round13.md). Tuning runs override the 1 with
    // OPFORGE_CUDA_CE_BLOCKS_PER_SM (1..16).
    static const int per_sm = env_choice("OPFORGE_CUDA_CE_BLOCKS_PER_SM", 1, 16);
    const int64_t want = ((per_sm ? per_sm : 1) * int64_t(props.sm_count) + rows - 1) / rows;
    const int64_t most = units / (kSplitBlock * kMinUnitsPerThread);
    splits = std::max<int64_t>(1, std::min(want, most));
    seg_units = (units + splits - 1) / splits;
    splits = (units + seg_units - 1) / seg_units;  // no empty segment
  }
  const softmax::FewRowPlan gather =  // Note [few-row cross_entropy gather]
      kVec && red != Red::none ? forward_gather(rows, units, props.sm_count) : softmax::FewRowPlan{};
  // Workspace: per-row losses (sum / mean), then the segments' partials (split rows or gather).
  const int64_t loss_bytes = red == Red::none ? 0 : (rows * int64_t(sizeof(float)) + 15) / 16 * 16;
  const int64_t part_bytes = gather.ranks ? rows * gather.ranks * int64_t(sizeof(float4))
                             : splits > 1 ? rows * splits * 3 * int64_t(sizeof(float))
                                          : 0;
  char* ws = loss_bytes + part_bytes > 0 ? static_cast<char*>(cuda_workspace(ctx, loss_bytes + part_bytes)) : nullptr;
  float* per_row = red == Red::none ? loss.ptr<float>() : reinterpret_cast<float*>(ws);
  float* partials = part_bytes > 0 ? reinterpret_cast<float*>(ws + loss_bytes) : nullptr;
  RowReduce reduce;  // sum / mean of the per-row losses (out null: none)
  if (red != Red::none) {
    reduce.losses = per_row, reduce.rows = rows, reduce.labels = target.ptr<int64_t>();
    reduce.labels_stride = stride0(target), reduce.ignore_index = o.ignore_index, reduce.divide = red == Red::mean;
    reduce.out = loss.ptr<float>();
  }
  bool reduced = false;  // by the launch that wrote the rows' losses
  dispatch_float(logits.dtype, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    ForwardArgs<T> p{};
    p.logits = logits.ptr<T>(), p.logits_stride = row_stride_of(logits);
    p.rows = rows, p.vocab = vocab;
    p.target = target.ptr<int64_t>(), p.target_stride = stride0(target);
    p.loss = per_row, p.loss_stride = red == Red::none ? stride0(loss) : 1;
    p.lse = lse.ptr<float>(), p.lse_stride = stride0(lse);
    p.o = o;
    if (gather.ranks) {
      launch_forward_gather(ctx, p, units, gather, reinterpret_cast<float4*>(partials), cuda_grid_barrier(ctx),
                            red == Red::none ? 0 : red == Red::sum ? 1 : 2, loss.ptr<float>());
      reduced = true;
      return;
    }
    if constexpr (kVec) {
      if (rows < props.sm_count &&
          launch_forward_cluster(ctx, p, units, props.sm_count, cuda_grid_barrier(ctx), reduce)) {
        reduced = true;
        return;
      }
    }
    if (splits > 1) {
      // A plain launch: with Note [programmatic launch] this kernel measured 9.9 -> 10.5 us at 16 x
      // 128,256 on an H200 (docs/perf/gpu-h200-2026-11-27-round13.md).
      forward_split_kernel<T, kVec><<<unsigned(rows * splits), unsigned(kSplitBlock), 0, stream>>>(
          p, splits, seg_units, partials, cuda_grid_barrier(ctx), red == Red::none ? 0 : red == Red::sum ? 1 : 2,
          loss.ptr<float>());
      check_launch("cross_entropy split kernel launch");
      reduced = true;
      return;
    }
    int rt = 32;  // a warp per short row, up to 256 threads per long row; several rows per SM
    static const int row_units = env_choice("OPFORGE_CUDA_CE_ROW_UNITS", 1, 256);  // Note [row threads]
    while (rt < 256 && int64_t(rt) * (row_units ? row_units : kRowUnits) < units) rt *= 2;
    const int block = 256;
    const int64_t rows_per_block = block / rt;
    const int64_t max_blocks = int64_t(props.sm_count) * (2048 / block) * 4;
    const int64_t blocks = std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, max_blocks);
    if constexpr (kVec) {
      if (launch_forward_pipeline(ctx, p, units, blocks)) return;  // Note [cross_entropy row pipeline]
    }
    static const bool plain_on = !env_off("OPFORGE_CUDA_CE_PLAIN");  // Note [plain row scan]
    const bool plain = kVec && plain_on && o.softcap == 0.0f && o.smoothing == 0.0f;
    auto kernel = plain ? forward_kernel<T, kVec, true> : forward_kernel<T, kVec, false>;
    launch_programmatic(ctx, "cross_entropy kernel launch", kernel, dim3(unsigned(blocks)),
                        dim3(block), 0, p, rt);
  });
  if (red != Red::none && !reduced) launch_row_reduce(ctx, reduce, "cross_entropy reduction launch");
}

template <bool kVec>
void backward(const Context& ctx, const TensorView& dlogits, const TensorView& dloss, const TensorView& logits,
              const TensorView& target, const TensorView& lse, const Options& o, Red red) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0 || vocab == 0) return;
  DeviceGuard guard(ctx.device.index);
  const float* kept = nullptr;
  const bool count_in_block = red == Red::mean && rows <= kCountInBlockRows;  // blocks of 256 threads
  if (red == Red::mean && !count_in_block) {
    float* count = static_cast<float*>(cuda_workspace(ctx, sizeof(float)));
    RowReduce r;
    r.rows = rows, r.labels = target.ptr<int64_t>(), r.labels_stride = stride0(target);
    r.ignore_index = o.ignore_index, r.divide = true, r.count_only = true, r.out = count;
    launch_row_reduce(ctx, r, "cross_entropy_backward count launch");
    kept = count;
  }
  dispatch_float(logits.dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    BackwardArgs<T> p{};
    p.dlogits = dlogits.ptr<T>(), p.dlogits_stride = row_stride_of(dlogits);
    p.logits = logits.ptr<T>(), p.logits_stride = row_stride_of(logits);
    p.rows = rows, p.vocab = vocab;
    p.target = target.ptr<int64_t>(), p.target_stride = stride0(target);
    p.lse = lse.data, p.lse_dtype = lse.dtype, p.lse_stride = stride0(lse);
    p.dloss = dloss.data, p.dloss_dtype = dloss.dtype, p.dloss_stride = red == Red::none ? stride0(dloss) : 0;
    p.kept = kept;
    p.count_in_block = count_in_block;
    p.o = o;
    const int64_t units = vocab / UnitOf<T, kVec>::width;
    // Note [backward units]: the most units a thread (4, 2 or 1) that still leave the launch
    // 1.5 blocks an SM. H200, bf16, us at 1 / 2 / 4 units: 1,024 x 128,256 191.6 / 148.4 / 134.4
    // (94% of copy), 8,192 x 128,256 1,506 / 1,150 / 1,033, 16 x 128,256 (256 blocks at 4)
    // 4.26 / 3.91 / 3.77, 16 x 32,000 (250 blocks at 1) 2.28 / 2.35 / 2.91; 8 units a thread
    // (95 registers) were slower than 4 everywhere (docs/perf/gpu-h200-2026-11-29-round27.md).
    // OPFORGE_CUDA_CE_BWD_UNITS (1, 2, 4 or 8) fixes it (tuning).
    static const int forced = env_choice("OPFORGE_CUDA_CE_BWD_UNITS", 1, 8);
    auto launch = [&](auto kernel, int k) {
      const ElementLaunch shape = element_launch(units, rows, k);
      launch_programmatic(ctx, "cross_entropy_backward kernel launch", kernel, shape.grid, shape.block, 0, p);
    };
    const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
    auto blocks_with = [&](int k) { return rows * ((units + 256 * k - 1) / (256 * k)); };
    int k = forced;
    if (k == 0) {
      k = 4;
      while (k > 1 && 2 * blocks_with(k) < 3 * int64_t(props.sm_count)) k /= 2;
    }
    if (k >= 8) launch(backward_kernel<T, kVec, 8>, 8);
    else if (k >= 4) launch(backward_kernel<T, kVec, 4>, 4);
    else if (k >= 2) launch(backward_kernel<T, kVec, 2>, 2);
    else launch(backward_kernel<T, kVec, 1>, 1);
  });
}

}  // namespace

void launch_row_reduce(const Context& ctx, const RowReduce& r, const char* what) {
  launch_programmatic(ctx, what, reduce_kernel, dim3(1), dim3(1024), 0, r);
}

}  // namespace cuda::loss

using namespace cuda::loss;  // NOLINT

bool ce_forward_gathers(const TensorView& logits) {
  const int64_t units = logits.size(1) / (16 / logits.itemsize());
  return forward_gather(logits.size(0), units, cuda_device_props(logits.device.index).sm_count).ranks != 0;
}

void cross_entropy_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& logits,
                        const TensorView& target, int64_t ignore_index, double label_smoothing,
                        double lse_square_scale, double softcap, std::string_view reduction) {
  forward<false>(ctx, loss, lse, logits, target, options_of(ignore_index, label_smoothing, lse_square_scale, softcap),
                 red_of(reduction));
}
void cross_entropy_cuda_vec16(const Context& ctx, const TensorView& loss, const TensorView& lse,
                              const TensorView& logits, const TensorView& target, int64_t ignore_index,
                              double label_smoothing, double lse_square_scale, double softcap,
                              std::string_view reduction) {
  forward<true>(ctx, loss, lse, logits, target, options_of(ignore_index, label_smoothing, lse_square_scale, softcap),
                red_of(reduction));
}
const char* cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                                          const TensorView&, int64_t, double, double, double, std::string_view) {
  if (!cuda::is_cuda_float(logits.dtype)) return cuda::kNotCudaFloat;
  if (loss.dtype != DType::f32 || lse.dtype != DType::f32) return "loss and lse are not f32";
  return nullptr;
}
const char* cross_entropy_cuda_vec16_applicable(const TensorView& loss, const TensorView& lse,
                                                const TensorView& logits, const TensorView& target, int64_t i,
                                                double ls, double z, double c, std::string_view r) {
  if (const char* why = cross_entropy_cuda_applicable(loss, lse, logits, target, i, ls, z, c, r)) return why;
  return cuda::pack_rows_problem(logits, logits.size(1));
}

void cross_entropy_backward_cuda(const Context& ctx, const TensorView& dlogits, const TensorView& dloss,
                                 const TensorView& logits, const TensorView& target, const TensorView& lse,
                                 int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                 double softcap, std::string_view reduction) {
  backward<false>(ctx, dlogits, dloss, logits, target, lse,
                  options_of(ignore_index, label_smoothing, lse_square_scale, softcap), red_of(reduction));
}
void cross_entropy_backward_cuda_vec16(const Context& ctx, const TensorView& dlogits, const TensorView& dloss,
                                       const TensorView& logits, const TensorView& target, const TensorView& lse,
                                       int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                       double softcap, std::string_view reduction) {
  backward<true>(ctx, dlogits, dloss, logits, target, lse,
                 options_of(ignore_index, label_smoothing, lse_square_scale, softcap), red_of(reduction));
}
const char* cross_entropy_backward_cuda_applicable(const TensorView&, const TensorView& dloss,
                                                   const TensorView& logits, const TensorView&,
                                                   const TensorView& lse, int64_t, double, double, double,
                                                   std::string_view) {
  if (!cuda::is_cuda_float(logits.dtype)) return cuda::kNotCudaFloat;
  if (!float_like(dloss.dtype) || !float_like(lse.dtype)) return "dloss or lse is not f64, f32, f16 or bf16";
  return nullptr;
}
const char* cross_entropy_backward_cuda_vec16_applicable(const TensorView& dlogits, const TensorView& dloss,
                                                         const TensorView& logits, const TensorView& target,
                                                         const TensorView& lse, int64_t i, double ls, double z,
                                                         double c, std::string_view r) {
  if (const char* why = cross_entropy_backward_cuda_applicable(dlogits, dloss, logits, target, lse, i, ls, z, c, r))
    return why;
  if (const char* why = cuda::pack_rows_problem(logits, logits.size(1))) return why;
  return cuda::pack_rows_problem(dlogits, dlogits.size(1));
}

void register_loss_cuda(Registry& reg) {
  const char* fwd_vec = "16-byte packs, one read per row (online max/sum, softcap on the fly), fixed-order sum";
  const char* fwd = "any layout: one element per thread-step, one read per row, fixed-order sum";
  const char* bwd_vec = "one streaming pass of 16-byte packs from the saved lse, no reduction";
  const char* bwd = "any layout: one streaming pass from the saved lse";
  reg.add_kernel<CrossEntropy>(cuda_kernel_desc("cuda_vec16", 200, fwd_vec, false), &cross_entropy_cuda_vec16,
                               &cross_entropy_cuda_vec16_applicable);
  reg.add_kernel<CrossEntropy>(cuda_kernel_desc("cuda", 100, fwd, false), &cross_entropy_cuda,
                               &cross_entropy_cuda_applicable);
  reg.add_kernel<CrossEntropyBackward>(cuda_kernel_desc("cuda_vec16", 200, bwd_vec, false),
                                       &cross_entropy_backward_cuda_vec16,
                                       &cross_entropy_backward_cuda_vec16_applicable);
  reg.add_kernel<CrossEntropyBackward>(cuda_kernel_desc("cuda", 100, bwd, false), &cross_entropy_backward_cuda,
                                       &cross_entropy_backward_cuda_applicable);
  register_divergence_cuda(reg);
  register_ce_with_grad_cuda(reg);
}

}  // namespace opforge
