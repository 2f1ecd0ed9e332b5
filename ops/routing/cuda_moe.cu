// CUDA kernels of moe_permute and moe_unpermute (routing.h, Note [moe permutation]).
//
// Ids and inv_perm entries on the device are not range-checked by the ops' checks (reading them
// would synchronize with the host). The kernels never read or write out of bounds for them:
// moe_permute sorts a pair whose id is outside [0, E) into an extra bucket E after every expert
// (rows [offsets[E], T * k), increasing pair order; offsets[E] then counts the in-range pairs);
// moe_unpermute skips an inv_perm entry outside [0, T * k) (it contributes nothing).
//
// moe_permute: a stable counting sort whose result is a function of the ids alone (no atomics
// whose order could show): the pairs p = t * k + j are cut into C chunks of `chunk` pairs
// (chunk a multiple of 32, at least 256 and at least B, C <= 65536: Note [sort chunks]), B = E + 1
// buckets.
//   1. count_kernel, one 256-thread block per chunk: per-bucket counts of the chunk in shared
//      memory (shared atomics on integers: the totals do not depend on their order), written
//      bucket-major to counts[b * C + c].
//   2. cub::DeviceScan::ExclusiveSum over the B * C counts in that bucket-major order: bases[b * C
//      + c] = the first row of bucket b's pairs of chunk c (all pairs of lower buckets, then those
//      of bucket b in lower chunks). Integer sums: exact and deterministic.
//   3. rank_kernel, one warp per chunk: the chunk's bases go to shared memory; the warp walks its
//      pairs 32 at a time in increasing p (their ids loaded 8 steps ahead: Note [rank batches]),
//      __match_any_sync groups the lanes of equal bucket, a lane's row is its bucket's cursor +
//      the number of lower lanes in its group, and the group's highest lane advances the cursor
//      by the group's size. So the row of p is the bucket start + the number of earlier pairs of
//      its bucket: the stable order. inv_perm[p] = row; chunk 0 also writes expert_offsets[b] =
//      bases[b * C] for b = 0..E.
//   4. copy_kernel: the rows, token-major. 2-D blocks of 256 threads, x over the row's units
//      (16-byte packs for cuda_vec16, single elements for cuda), y over tokens (grid y capped at
//      65535 with a token stride loop); a thread reads its unit of x row t once and stores it to
//      rows inv_perm[t * k + j], j = 0..k-1.
//   Scratch (counts, bases, CUB's temporary storage) is the per-stream workspace (Note [cuda
//   workspace]); no allocation after the first call of a size, no host synchronization. Buckets
//   <= 4096 (32 KiB of shared cursors): the predicate says "more than 4095 experts".
//   Small problems: up to kSmallPairs = 4096 pairs (16 tokens x top-8 is 128) the four launches
//   (8.3 us at 128 pairs, hidden 2048 bf16 on an H200, nearly all launch latency) are one:
//   small_permute_kernel, 128-thread blocks of 4 warps, one warp per pair. Every block puts the
//   buckets of all pairs in shared memory; the warp of pair p counts rank(p) = #(q: bucket(q) <
//   bucket(p)) + #(q < p: bucket(q) = bucket(p)) 32 pairs a step with a ballot (the stable row
//   of the sort above, by its definition), writes inv_perm[p] and copies row p / k of x to it.
//   Block 0 also writes expert_offsets[b] = #(q: bucket(q) < b): a shared histogram of the
//   buckets (warp-aggregated shared atomics on integers: totals do not depend on their order)
//   and a block exclusive scan. Same bits as the sort path for every input, no scratch.
//
// moe_unpermute: one block per token (grid y over tokens, capped at 65535 with a stride loop),
// 256 threads over the row's units (16-byte packs for cuda_vec16, single elements for cuda); each
// thread sums w[t, j] * expert_out[inv_perm[t * k + j]] for j = 0..k-1 in f32 in that order and
// rounds once. inv_perm and the weights of the token are read by every thread (L1 broadcasts);
// the j loop is unrolled by 4 without branches, so up to 4 row loads per thread are in flight;
// with k <= 2 the 16-bit kernel is compiled for 8 blocks an SM instead (Note [combine occupancy]).
// 64-bit offsets throughout. Vec16 predicates: 16-byte aligned bases, hidden and row strides
// multiples of the pack (8 bf16 / f16, 4 f32), as pack_rows_problem says.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"
#include "opforge/plan.h"
#include "ops/routing/internal.h"
#include "ops/routing/routing_cuda.h"

namespace opforge {
namespace cuda::moe {
namespace {

constexpr int64_t kMaxBuckets = 4096;

// The one-launch path up to kSmallPairs pairs (small_permute_kernel). Every block reads all ids,
// so the id traffic is pairs^2 / kSmallWarps * 4 bytes (16 MiB at 4096 pairs, L2 hits) and a
// warp's rank takes pairs / 32 ballot steps (128 at 4096): both grow with pairs^2, while the sort
// path costs four launches and a chain of dependent steps. Measured on an H200, bf16, the paths
// side by side (us, one-launch / sort): 128 experts k 8 hidden 2048, 2048 pairs 7.8 / 12.3, 3072
// 11.2 / 13.7, 4096 14.0 / 15.1, 6144 23.4 / 17.6, 8192 38.9 / 20.8; 8 experts k 2 hidden 4096,
// 3072 pairs 16.9 / 18.0, 4096 20.6 / 21.3 (docs/perf/gpu-h200-2026-12-03-round44.md).
constexpr int64_t kSmallPairs = 4096;
// 128-thread blocks (4 pairs each: 32 blocks at 128 pairs, spread over as many SMs), a lane's
// loads kSmallBatch at a time.
constexpr int kSmallThreads = 128, kSmallWarps = kSmallThreads / 32;  // one warp per pair
constexpr int kSmallBatch = 8;
constexpr int kSmallIdBatch = 4, kSmallIdBatchPairs = 768;  // Note [small id batches]
// The sort path: at least kChunkPairs pairs a chunk (Note [sort chunks]); ids a lane loads ahead
// in rank_kernel (Note [rank batches]); inv_perm entries a thread loads ahead in copy_kernel.
constexpr int64_t kChunkPairs = 256;
constexpr int kRankBatch = 8, kCopyBatch = 8;

int64_t align_up(int64_t n) { return (n + 255) / 256 * 256; }

// ---- moe_permute: the counting sort --------------------------------------------------------------
__device__ __forceinline__ int bucket_of(int32_t id, int experts) {
  return id >= 0 && id < experts ? int(id) : experts;  // out of range: the extra bucket E
}

__global__ void __launch_bounds__(256) count_kernel(const int32_t* ids, int64_t pairs, int64_t chunk,
                                                    int experts, int64_t chunks, int64_t* counts) {
  extern __shared__ int shared_counts[];
  programmatic_prologue();  // Note [programmatic launch]
  const int buckets = experts + 1;
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) shared_counts[b] = 0;
  __syncthreads();
  const int64_t c = blockIdx.x, begin = c * chunk, end = min(pairs, begin + chunk);
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x)
    atomicAdd(&shared_counts[bucket_of(ids[p], experts)], 1);
  __syncthreads();
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) counts[int64_t(b) * chunks + c] = shared_counts[b];
}

template <class I>
__global__ void __launch_bounds__(32) rank_kernel(const int32_t* ids, int64_t pairs, int64_t chunk,
                                                  int experts, int64_t chunks, const int64_t* bases,
                                                  I* inv, int64_t* offsets) {
  extern __shared__ int64_t cursor[];
  programmatic_prologue();  // Note [programmatic launch]
  const int buckets = experts + 1, lane = threadIdx.x;
  const int64_t c = blockIdx.x;
  for (int b = lane; b < buckets; b += 32) {
    cursor[b] = bases[int64_t(b) * chunks + c];
    if (c == 0) offsets[b] = cursor[b];  // bucket starts: expert_offsets[0..E]
  }
  __syncwarp();
  const unsigned lower = (1u << lane) - 1u;
  const int64_t begin = c * chunk, end = min(pairs, begin + chunk);
  // Note [rank batches]: the ids of kRankBatch warp steps are loaded before the first step, so
  // the serial chain of steps (each needs the cursors the previous one advanced) waits on one
  // memory round trip per kRankBatch steps, not one per step.
  for (int64_t first = begin; first < end; first += 32 * kRankBatch) {  // uniform over the warp
    int b[kRankBatch];
#pragma unroll
    for (int s = 0; s < kRankBatch; ++s) {
      const int64_t p = first + 32 * s + lane;
      b[s] = p < end ? bucket_of(ids[p], experts) : buckets;  // buckets: no pair
    }
#pragma unroll
    for (int s = 0; s < kRankBatch; ++s) {
      if (first + 32 * s >= end) break;  // uniform over the warp
      const int64_t p = first + 32 * s + lane;
      const bool valid = b[s] < buckets;
      const unsigned group = __match_any_sync(0xffffffffu, b[s]);
      const int64_t row = valid ? cursor[b[s]] + __popc(group & lower) : 0;
      __syncwarp();
      if (valid) {
        inv[p] = I(row);
        if ((group >> lane) == 1u) cursor[b[s]] += __popc(group);  // the group's highest lane
      }
      __syncwarp();
    }
  }
}

template <class T, class I, bool kVec> struct CopyArgs {
  T* out;
  const T* x;
  const I* inv;
  int64_t out_stride, x_stride, tokens, topk, hidden;
};

// Token-major: a thread reads its unit of x row t once and writes it to the rows of the token's
// k pairs; the k inv_perm entries are loaded together (L1 broadcasts within the block), and the
// k stores wait on nothing but the one load.
template <class T, class I, bool kVec> __global__ void __launch_bounds__(256) copy_kernel(CopyArgs<T, I, kVec> a) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = a.hidden / width;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t t = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; t < a.tokens; t += step) {
    const T* src = a.x + t * a.x_stride + u * width;
    const I* inv = a.inv + t * a.topk;
    using Raw = std::conditional_t<kVec, Pack<T>, T>;
    Raw v;
    if constexpr (kVec) v = load_pack_readonly(src);
    else v = *src;
    for (int64_t j0 = 0; j0 < a.topk; j0 += kCopyBatch) {
      int64_t row[kCopyBatch];  // loaded before the first store of the batch
#pragma unroll
      for (int j = 0; j < kCopyBatch; ++j) row[j] = j0 + j < a.topk ? int64_t(inv[j0 + j]) : 0;
#pragma unroll
      for (int j = 0; j < kCopyBatch; ++j) {
        if (j0 + j >= a.topk) break;
        T* dst = a.out + row[j] * a.out_stride + u * width;
        if constexpr (kVec) store_pack(dst, v);
        else *dst = v;
      }
    }
  }
}

// ---- moe_permute: the one-launch path (pairs <= kSmallPairs) --------------------------------------
template <class T, class I, bool kVec> struct SmallArgs {
  T* out;
  const T* x;
  const int32_t* ids;
  I* inv;
  int64_t* offsets;
  int64_t out_stride, x_stride, topk, hidden;
  int pairs, experts;  // 1 <= pairs <= kSmallPairs, experts + 1 <= kMaxBuckets
};

// Grid ceil(pairs / kSmallWarps) x kSmallThreads; dynamic shared memory (pairs + experts + 1)
// ints: the buckets of all pairs, then block 0's histogram (20 KiB at most). Barriers only before
// the per-warp part and inside block 0's uniform branch, so every thread reaches each of them.
template <class T, class I, bool kVec>
__global__ void __launch_bounds__(kSmallThreads) small_permute_kernel(SmallArgs<T, I, kVec> a) {
  programmatic_prologue();  // Note [programmatic launch]
  using Scan = cub::BlockScan<int, kSmallThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  extern __shared__ int small_shared[];
  const int pairs = a.pairs, buckets = a.experts + 1;
  int* bucket = small_shared;         // [pairs]
  int* count = small_shared + pairs;  // [buckets], block 0 only
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool first = blockIdx.x == 0;
  // Note [small id batches]: as a plain loop the compiler unrolls the ids' loads by four behind a
  // remainder loop whose loads each wait for the last, so 192 or 384 pairs took 2 or 3 dependent
  // round trips where 512 took one (H200, 128 experts k 8 hidden 2048: 24 tokens timed as 32, 48
  // as 64, 96 as 128). Up to kSmallIdBatchPairs pairs a thread's ids are instead loaded
  // kSmallIdBatch at a time, every load issued before the first shared store: 24 / 48 / 96
  // tokens 2.92 / 3.44 / 4.97 -> 2.76 / 3.07 / 4.60 us. From 1,024 pairs on the same batches
  // measured 5-11% slower than the plain loop (128-512 tokens at top-8; why is not established),
  // so larger calls keep the loop.
  if (pairs <= kSmallIdBatchPairs) {
    for (int base = threadIdx.x; base < pairs; base += kSmallThreads * kSmallIdBatch) {
      int32_t id[kSmallIdBatch];
#pragma unroll
      for (int k = 0; k < kSmallIdBatch; ++k) {
        const int q = base + k * kSmallThreads;
        id[k] = q < pairs ? a.ids[q] : 0;
      }
#pragma unroll
      for (int k = 0; k < kSmallIdBatch; ++k) {
        const int q = base + k * kSmallThreads;
        if (q < pairs) bucket[q] = bucket_of(id[k], a.experts);
      }
    }
  } else {
    for (int q = threadIdx.x; q < pairs; q += kSmallThreads) bucket[q] = bucket_of(a.ids[q], a.experts);
  }
  if (first)
    for (int b = threadIdx.x; b < buckets; b += kSmallThreads) count[b] = 0;
  __syncthreads();
  if (first) {  // uniform over the block: its barriers are reached by every thread of block 0
    // Histogram: the lanes of equal bucket (__match_any_sync) add their number once, so a skewed
    // routing (every pair to one expert) costs one atomic per warp step, not 32.
    for (int base = warp * 32; base < pairs; base += kSmallThreads) {  // uniform over the warp
      const int q = base + lane;
      const int b = q < pairs ? bucket[q] : buckets;  // buckets: no bucket
      const unsigned group = __match_any_sync(0xffffffffu, b);
      if (b < buckets && (group & ((1u << lane) - 1u)) == 0) atomicAdd(&count[b], __popc(group));
    }
    __syncthreads();
    // Exclusive scan: thread t sums its run of `per` consecutive buckets, the block scans the run
    // totals, then the thread walks its run again writing the starts.
    const int per = (buckets + kSmallThreads - 1) / kSmallThreads;  // <= 32
    const int lo = min(buckets, int(threadIdx.x) * per), hi = min(buckets, lo + per);
    int run = 0;
    for (int b = lo; b < hi; ++b) run += count[b];
    int start;
    Scan(scan_storage).ExclusiveSum(run, start);
    for (int b = lo; b < hi; ++b) {
      a.offsets[b] = start;  // expert_offsets[0..E]
      start += count[b];
    }
  }
  const int p = int(blockIdx.x) * kSmallWarps + warp;
  if (p >= pairs) return;  // the whole warp; no barrier follows
  const int mine = bucket[p];
  int row = 0;  // the stable rank: lower buckets, then earlier pairs of the same bucket
  for (int base = 0; base < pairs; base += 32) {  // uniform over the warp
    const int q = base + lane;
    const int b = q < pairs ? bucket[q] : buckets;  // past the end: after every bucket
    row += __popc(__ballot_sync(0xffffffffu, b < mine || (b == mine && q < p)));
  }
  if (lane == 0) a.inv[p] = I(row);
  // The row copy: kSmallBatch loads a lane issued before the first store (the compiler may not
  // move a load across a store that could alias it), so a lane's share of a 4 KB row (hidden 2048
  // bf16: 8 packs) is in flight at once instead of one round trip per pack.
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  using Raw = std::conditional_t<kVec, Pack<T>, T>;
  const int64_t units = a.hidden / width, t = int64_t(p) / a.topk;
  T* dst = a.out + int64_t(row) * a.out_stride;
  const T* src = a.x + t * a.x_stride;
  for (int64_t base = lane; base < units; base += 32 * kSmallBatch) {
    Raw v[kSmallBatch];
#pragma unroll
    for (int k = 0; k < kSmallBatch; ++k) {
      const int64_t u = base + 32 * k;
      if (u < units) {
        if constexpr (kVec) v[k] = load_pack_readonly(src + u * width);
        else v[k] = src[u];
      }
    }
#pragma unroll
    for (int k = 0; k < kSmallBatch; ++k) {
      const int64_t u = base + 32 * k;
      if (u < units) {
        if constexpr (kVec) store_pack(dst + u * width, v[k]);
        else dst[u] = v[k];
      }
    }
  }
}

// 2-D block of 256 threads: x over a row's units (a power of two up to 256), y over rows.
dim3 rows_block(int64_t units) {
  int bx = 1;
  while (bx < units && bx < 256) bx *= 2;
  return dim3(unsigned(bx), unsigned(256 / bx));
}

template <bool kVec>
void run_permute(const Context& ctx, const TensorView& permuted, const TensorView& offsets,
                 const TensorView& inv_perm, const TensorView& x, const TensorView& ids,
                 int64_t num_experts) {
  const MoePermutePlan p = moe_permute_plan(permuted, offsets, inv_perm, x, ids, num_experts);
  DeviceGuard guard(ctx.device.index);
  cudaStream_t stream = stream_of(ctx);
  const int64_t pairs = p.tokens * p.topk, buckets = p.experts + 1;
  if (pairs == 0) {
    OPFORGE_CUDA_CHECK(cudaMemsetAsync(p.offsets, 0, size_t(buckets) * sizeof(int64_t), stream));
    return;
  }
  // OPFORGE_CUDA_MOE_SMALL=0 turns the one-launch path off, for side-by-side timing.
  static const bool small_path = !env_off("OPFORGE_CUDA_MOE_SMALL");
  // Note [plan regimes]: the time per pair changes where the one-launch path ends (H200, Qwen3-30B's
  // 128 experts, k 8, hidden 2048: 14.0 us at 512 tokens, 16.9 at 768, the sort's launches and
  // chain of steps), so the collector keeps the two paths' rows apart.
  // OPFORGE_CUDA_MOE_SMALL_PAIRS moves the path's end (a power of two, 256..8192), for tuning.
  static const int64_t small_pairs = [] {
    const int v = env_choice("OPFORGE_CUDA_MOE_SMALL_PAIRS", 256, 8192);
    return v ? int64_t(v) : kSmallPairs;
  }();
  // The one-launch path's shared memory stays within the 48 KiB a launch gets without opting in.
  const bool one_launch =
      small_path && pairs <= small_pairs && (pairs + buckets) * int64_t(sizeof(int)) <= 48 * 1024;
  plan::note("sort", !one_launch, double(pairs), double(small_pairs + 1));
  if (one_launch) {  // small_permute_kernel
    auto small = [&](auto inv_tag) {
      using I = decltype(inv_tag);
      dispatch_float(p.dtype, "moe_permute", [&](auto tag) {
        using T = decltype(tag);
        SmallArgs<T, I, kVec> a{static_cast<T*>(p.out), static_cast<const T*>(p.x), p.ids,
                                static_cast<I*>(p.inv), p.offsets, p.out_stride, p.x_stride,
                                p.topk, p.hidden, int(pairs), int(p.experts)};
        const dim3 grid(unsigned((pairs + kSmallWarps - 1) / kSmallWarps));
        const size_t smem = size_t(pairs + buckets) * sizeof(int);
        launch_programmatic(ctx, "moe_permute small kernel launch", small_permute_kernel<T, I, kVec>, grid,
                            dim3(kSmallThreads), smem, a);
      });
    };
    if (p.inv_i64) small(int64_t{});
    else small(int32_t{});
    return;
  }
  // Note [sort chunks]: a chunk is ranked by one warp, one step of 32 pairs after the other, so
  // the chunk length is the sort's critical path: 1,024-pair chunks made it 32 steps (about 20 us
  // on an H200 at any size from 1,536 pairs on). kChunkPairs = 256 is 8 steps. The chunk is also
  // at least the bucket count, so the B x C counts (8 bytes each) stay within twice the ids'
  // bytes, and at most 65,536 chunks.
  int64_t chunk = std::max({kChunkPairs, buckets, (pairs + 65535) / 65536});
  chunk = (chunk + 31) / 32 * 32;
  const int64_t chunks = (pairs + chunk - 1) / chunk, n = buckets * chunks;
  size_t cub_bytes = 0;
  OPFORGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, static_cast<const int64_t*>(nullptr),
                                                   static_cast<int64_t*>(nullptr), int(n), stream));
  const int64_t part = align_up(n * int64_t(sizeof(int64_t)));
  char* scratch = static_cast<char*>(cuda_workspace(ctx, 2 * part + int64_t(cub_bytes)));
  auto* counts = reinterpret_cast<int64_t*>(scratch);
  auto* bases = reinterpret_cast<int64_t*>(scratch + part);
  launch_programmatic(ctx, "moe_permute count kernel launch", count_kernel, dim3(unsigned(chunks)), dim3(256),
                      size_t(buckets) * sizeof(int), p.ids, pairs, chunk, int(p.experts), chunks, counts);
  OPFORGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch + 2 * part, cub_bytes, counts, bases, int(n), stream));

  auto rest = [&](auto inv_tag) {
    using I = decltype(inv_tag);
    I* inv = static_cast<I*>(p.inv);
    launch_programmatic(ctx, "moe_permute rank kernel launch", rank_kernel<I>, dim3(unsigned(chunks)), dim3(32),
                        size_t(buckets) * sizeof(int64_t), p.ids, pairs, chunk, int(p.experts), chunks,
                        static_cast<const int64_t*>(bases), inv, p.offsets);
    if (p.hidden == 0) return;
    dispatch_float(p.dtype, "moe_permute", [&](auto tag) {
      using T = decltype(tag);
      CopyArgs<T, I, kVec> a{static_cast<T*>(p.out), static_cast<const T*>(p.x), inv, p.out_stride,
                             p.x_stride, p.tokens, p.topk, p.hidden};
      const int64_t units = p.hidden / (kVec ? Pack<T>::n : 1);
      const dim3 block = rows_block(units);
      const dim3 grid(unsigned((units + block.x - 1) / block.x),
                      unsigned(std::min<int64_t>((p.tokens + block.y - 1) / block.y, 65535)));
      launch_programmatic(ctx, "moe_permute copy kernel launch", copy_kernel<T, I, kVec>, grid, block, 0, a);
    });
  };
  if (p.inv_i64) rest(int64_t{});
  else rest(int32_t{});
}

// ---- moe_unpermute -------------------------------------------------------------------------------
template <class T, class I, bool kVec> struct CombineArgs {
  T* y;
  const T* in;
  const I* inv;
  const float* weights;
  int64_t y_stride, in_stride, tokens, topk, hidden, pairs;
};

// Note [combine occupancy]: with top-k <= 2 a thread has only one or two rows to load, so the
// loads in flight an SM are set by its warps: the 16-byte kernel of 16-bit data is then compiled
// for 8 blocks of 256 an SM (32 registers; ptxas alone takes 54-55 through nvcc 13.0, 4 blocks).
// H200, bf16, in one call: 16,384 tokens x 4,096, 8 experts, k = 2 (Mixtral) 137.6 -> 99.9 us
// (70.6% -> 97.5% of copy). With k = 8 (Qwen3, hidden 2,048) the unrolled loads need the
// registers: the bound made 1 / 16 / 4,096 tokens slower (1.69 -> 2.30, 1.80 -> 2.80, 31.8 ->
// 33.2 us), so k > 2 keeps ptxas's choice (docs/perf/gpu-h200-2026-12-02-round40.md).
template <class T, class I, bool kVec, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) combine_kernel(CombineArgs<T, I, kVec> a) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int width = kVec ? Pack<T>::n : 1;
  const int64_t units = a.hidden / width;
  for (int64_t t = blockIdx.y; t < a.tokens; t += gridDim.y) {
    const I* inv = a.inv + t * a.topk;
    const float* w = a.weights + t * a.topk;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
      float acc[width];
#pragma unroll
      for (int i = 0; i < width; ++i) acc[i] = 0.0f;
      // Branch-free so that the unrolled iterations' loads can be in flight together: an
      // out-of-range row (device ids are not checked) reads row 0 and leaves acc unchanged.
#pragma unroll 4
      for (int64_t j = 0; j < a.topk; ++j) {
        const int64_t r = int64_t(inv[j]);
        const bool ok = r >= 0 && r < a.pairs;
        const float wj = w[j];
        const T* src = a.in + (ok ? r : 0) * a.in_stride + u * width;
        if constexpr (kVec) {
          const Pack<T> v = load_pack_readonly(src);
#pragma unroll
          for (int i = 0; i < width; ++i) acc[i] = ok ? acc[i] + wj * to_f32(v.v[i]) : acc[i];
        } else {
          const float v = to_f32(*src);
          acc[0] = ok ? acc[0] + wj * v : acc[0];
        }
      }
      T* dst = a.y + t * a.y_stride + u * width;
      if constexpr (kVec) {
        Pack<T> out;
#pragma unroll
        for (int i = 0; i < width; ++i) out.v[i] = from_f32<T>(acc[i]);
        store_pack(dst, out);
      } else {
        *dst = from_f32<T>(acc[0]);
      }
    }
  }
}

template <bool kVec>
void run_unpermute(const Context& ctx, const TensorView& y, const TensorView& expert_out,
                   const TensorView& inv_perm, const TensorView& weights) {
  const MoeUnpermutePlan p = moe_unpermute_plan(y, expert_out, inv_perm, weights);
  if (p.tokens == 0 || p.hidden == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(p.dtype, "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto inv_tag) {
      using I = decltype(inv_tag);
      CombineArgs<T, I, kVec> a{static_cast<T*>(p.y), static_cast<const T*>(p.in),
                                static_cast<const I*>(p.inv), p.weights, p.y_stride, p.in_stride,
                                p.tokens, p.topk, p.hidden, p.tokens * p.topk};
      const int64_t units = p.hidden / (kVec ? Pack<T>::n : 1);
      const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (units + 31) / 32 * 32)));
      const dim3 grid(unsigned((units + threads - 1) / threads), unsigned(std::min<int64_t>(p.tokens, 65535)));
      auto go = [&](auto kernel) {
        launch_programmatic(ctx, "moe_unpermute kernel launch", kernel, grid, dim3(threads), 0, a);
      };
      if constexpr (kVec && sizeof(T) == 2) {
        if (p.topk <= 2) return go(combine_kernel<T, I, kVec, 8>);  // Note [combine occupancy]
      }
      go(combine_kernel<T, I, kVec, 1>);
    };
    if (p.inv_i64) launch(int64_t{});
    else launch(int32_t{});
  });
}

const char* permute_problem(const TensorView& x, const TensorView& ids, int64_t num_experts) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  if (num_experts + 1 > kMaxBuckets) return "more than 4095 experts";
  if (ids.numel() > 0x7fffffff) return "more than 2^31 - 1 pairs";
  return nullptr;
}

}  // namespace
}  // namespace cuda::moe

using TV = TensorView;

void moe_permute_cuda(const Context& ctx, const TV& permuted, const TV& offsets, const TV& inv,
                      const TV& x, const TV& ids, int64_t num_experts) {
  cuda::moe::run_permute<false>(ctx, permuted, offsets, inv, x, ids, num_experts);
}
const char* moe_permute_cuda_applicable(const TV&, const TV&, const TV&, const TV& x, const TV& ids,
                                        int64_t num_experts) {
  return cuda::moe::permute_problem(x, ids, num_experts);
}
void moe_permute_cuda_vec16(const Context& ctx, const TV& permuted, const TV& offsets, const TV& inv,
                            const TV& x, const TV& ids, int64_t num_experts) {
  cuda::moe::run_permute<true>(ctx, permuted, offsets, inv, x, ids, num_experts);
}
const char* moe_permute_cuda_vec16_applicable(const TV& permuted, const TV&, const TV&, const TV& x,
                                              const TV& ids, int64_t num_experts) {
  if (const char* why = cuda::moe::permute_problem(x, ids, num_experts)) return why;
  const int64_t hidden = x.ndim == 2 ? x.size(1) : 0;
  if (const char* why = cuda::pack_rows_problem(x, hidden)) return why;
  return cuda::pack_rows_problem(permuted, hidden);
}

void moe_unpermute_cuda(const Context& ctx, const TV& y, const TV& expert_out, const TV& inv,
                        const TV& weights) {
  cuda::moe::run_unpermute<false>(ctx, y, expert_out, inv, weights);
}
const char* moe_unpermute_cuda_applicable(const TV&, const TV& expert_out, const TV&, const TV&) {
  return cuda::is_cuda_float(expert_out.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void moe_unpermute_cuda_vec16(const Context& ctx, const TV& y, const TV& expert_out, const TV& inv,
                              const TV& weights) {
  cuda::moe::run_unpermute<true>(ctx, y, expert_out, inv, weights);
}
const char* moe_unpermute_cuda_vec16_applicable(const TV& y, const TV& expert_out, const TV&, const TV&) {
  if (!cuda::is_cuda_float(expert_out.dtype)) return cuda::kNotCudaFloat;
  const int64_t hidden = expert_out.ndim == 2 ? expert_out.size(1) : 0;
  if (const char* why = cuda::pack_rows_problem(expert_out, hidden)) return why;
  return cuda::pack_rows_problem(y, hidden);
}

void register_moe_cuda(Registry& reg) {
  reg.add_kernel<MoePermute>(
      cuda_kernel_desc("cuda_vec16", 200, "stable counting sort (one launch up to 4096 pairs; else chunk counts, CUB scan, warp ranks), 16-byte row copies", false),
      &moe_permute_cuda_vec16, &moe_permute_cuda_vec16_applicable);
  reg.add_kernel<MoePermute>(
      cuda_kernel_desc("cuda", 100, "stable counting sort (one launch up to 4096 pairs; else chunk counts, CUB scan, warp ranks), element row copies", false),
      &moe_permute_cuda, &moe_permute_cuda_applicable);
  reg.add_kernel<MoeUnpermute>(
      cuda_kernel_desc("cuda_vec16", 200, "one block per token, 16-byte loads, f32 weighted sum in j order", false),
      &moe_unpermute_cuda_vec16, &moe_unpermute_cuda_vec16_applicable);
  reg.add_kernel<MoeUnpermute>(
      cuda_kernel_desc("cuda", 100, "one block per token, element loads, f32 weighted sum in j order", false),
      &moe_unpermute_cuda, &moe_unpermute_cuda_applicable);
}

}  // namespace opforge
