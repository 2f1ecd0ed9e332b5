// The parts the split-KV decode kernels share (cuda_decode.cu: cuda_split, cuda_split_async;
// cuda_decode_mma.cu: cuda_split_mma): the argument block, the split plan, the workspace of
// partial states and the combine pass.
//
// A partial kernel handles one (split, kv head, sequence) per block and writes, for each query
// head of the group, the unnormalized state of its keys to the workspace: o [B, Hq, splits, D]
// and (m, l) [B, Hq, splits, 2], f32, m the running maximum of the base-2 scores and
// l = sum 2^(s - m). A split with no keys writes (m = -inf, l = 0). The combine pass then merges
// the splits of every (sequence, query head) in split order.
#pragma once

#include <cuda_pipeline.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/attention/attention_cuda.h"

namespace opforge::cuda::attention_split {
namespace {

// Keys a split holds at least. Measured on an H200 (2026-11-26, OPFORGE_CUDA_DECODE_MIN_CHUNK,
// GQA 32/8 x 128, us at 64 / 128 / 256 / 512): batch 1 ctx 8192: 27.9 / 22.3 / 21.0 / 26.0;
// batch 8 ctx 2048: 44.8 / 36.8 / 33.2 / 34.3; batch 32: 112.8 / 113.0 / 108.2 / 103.4; batch
// 256 the same at all four (744 us). Shorter splits pay the block's start-up and merge over too
// few keys.
constexpr int64_t kMinChunk = 256;
constexpr int64_t kMaxSplits = 1024;
constexpr int64_t kMaxPairs = int64_t(1) << 20;  // batch * Hkv: kMaxPairs * kMaxSplits < 2^31
constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kWaves = 4;  // waves of resident blocks a launch is sized for

template <class T> struct SplitArgs {
  T* out;
  const T* q;
  const T* k;
  const T* v;
  const int32_t* lens;
  float* part_o;   // [B, Hq, splits, D]
  float* part_ml;  // [B, Hq, splits, 2]: m (base-2 max), l
  int64_t out_rs, q_rs, k_rs, v_rs;
  int64_t hq, hkv, group, d, max_ctx;
  int64_t chunk, splits;
  float scale_log2;  // softmax scale * log2(e)
};

__device__ __forceinline__ int64_t clamp_len(int32_t n, int64_t max_ctx) {
  return n < 0 ? 0 : (int64_t(n) > max_ctx ? max_ctx : int64_t(n));
}

// cp.async.wait_group N with a memory clobber, so the compiler cannot move the shared-memory
// reads of the landed copies above it (the header's __pipeline_wait_prior has no clobber).
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Combine pass: one block of kCombineThreads per (sequence, query head), parallel over the splits
// (a loop over them in one thread waited out two dependent L2 loads a split: about 0.35 us each,
// 45 us at 128 splits). The block stages the weights w_s = 2^(m_s - M) in shared memory, sums
// den = sum_s w_s l_s by block reduction, then each thread accumulates 4 columns of o over every
// `groups`-th split (independent 16-byte loads) and the groups are added in a fixed order.
constexpr int kCombineThreads = 256;
template <class T> __global__ void __launch_bounds__(kCombineThreads) split_combine_kernel(SplitArgs<T> p) {
  __shared__ float s_w[kMaxSplits];
  __shared__ float s_red[32];
  __shared__ float4 s_acc[kCombineThreads];
  const int64_t row = blockIdx.x;  // b * Hq + h
  const int64_t b = row / p.hq;
  const int64_t len = clamp_len(p.lens[b], p.max_ctx);
  const int used = int((len + p.chunk - 1) / p.chunk);  // splits holding keys, <= p.splits
  const float* ml = p.part_ml + row * p.splits * 2;
  const float* o = p.part_o + row * p.splits * p.d;
  const int tid = int(threadIdx.x);

  float big = -INFINITY;
  for (int s = tid; s < used; s += kCombineThreads) big = fmaxf(big, ml[2 * s]);
  big = block_max(big, s_red);
  float den = 0.0f;
  for (int s = tid; s < used; s += kCombineThreads) {
    const float ms = ml[2 * s];
    const float w = ms == -INFINITY ? 0.0f : exp2f(ms - big);  // no finite score in the split: 0
    s_w[s] = w;
    den = fmaf(w, ml[2 * s + 1], den);
  }
  den = block_sum(den, s_red);  // its barriers also publish s_w

  const int cols = int(p.d / 4), groups = kCombineThreads / cols;  // d <= 256: groups >= 4
  const int c = tid % cols, grp = tid / cols;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (grp < groups) {
#pragma unroll 4
    for (int s = grp; s < used; s += groups) {
      const float w = s_w[s];
      if (w != 0.0f) {  // a split without keys holds no o
        const float4 v = __ldcg(reinterpret_cast<const float4*>(o + int64_t(s) * p.d) + c);
        acc.x = fmaf(w, v.x, acc.x), acc.y = fmaf(w, v.y, acc.y);
        acc.z = fmaf(w, v.z, acc.z), acc.w = fmaf(w, v.w, acc.w);
      }
    }
  }
  s_acc[tid] = acc;
  __syncthreads();
  if (tid < cols) {
    float4 sum = s_acc[tid];
    for (int g = 1; g < groups; ++g) {
      const float4 v = s_acc[g * cols + tid];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const bool any = den > 0.0f;  // no key at all: 0
    T* out = p.out + row * p.out_rs + 4 * tid;
    out[0] = from_f32<T>(any ? sum.x / den : 0.0f), out[1] = from_f32<T>(any ? sum.y / den : 0.0f);
    out[2] = from_f32<T>(any ? sum.z / den : 0.0f), out[3] = from_f32<T>(any ? sum.w / den : 0.0f);
  }
}

// What a partial block works on: block x = (sequence b, kv head g) x splits + split; its keys
// [begin, end) of sequence b (clamped to its length), and head0, the q / out row of the group's
// first query head.
struct SplitBlock {
  int64_t split, g, b, begin, end, head0;
};
// The block's SplitBlock; for a split with no keys (the same for the whole block) it also writes
// (m = -inf, l = 0) for the group's heads, and the block has nothing else to do (`begin >= end`).
template <class T> __device__ __forceinline__ SplitBlock split_block(const SplitArgs<T>& p, int tid) {
  SplitBlock k;
  const int64_t bid = blockIdx.x, pair = bid / p.splits;
  k.split = bid % p.splits, k.g = pair % p.hkv, k.b = pair / p.hkv;
  const int64_t len = clamp_len(p.lens[k.b], p.max_ctx);
  k.begin = k.split * p.chunk;
  k.end = k.begin + p.chunk < len ? k.begin + p.chunk : len;
  k.head0 = k.b * p.hq + k.g * p.group;
  if (k.begin >= k.end && tid < p.group) {
    const int64_t slot = (k.head0 + tid) * p.splits + k.split;
    p.part_ml[2 * slot] = -INFINITY;
    p.part_ml[2 * slot + 1] = 0.0f;
  }
  return k;
}

// End of a partial block: the warps' states (s_m, s_l [warp][head] with stride ml_warp; s_o
// [warp][head][column] with strides o_warp, o_head) merged in warp order for each (query head of
// the group, column), and written to the workspace slot of (sequence and head, split).
template <int kWarps, class T>
__device__ __forceinline__ void write_partials(const SplitArgs<T>& p, const float* s_o, int o_warp,
                                               int o_head, const float* s_m, const float* s_l,
                                               int ml_warp, int64_t head0, int64_t split, int tid,
                                               int threads) {
  for (int64_t e = tid; e < p.group * p.d; e += threads) {
    const int h = int(e / p.d), d = int(e % p.d);
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, s_m[w * ml_warp + h]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = s_m[w * ml_warp + h];
      const float c = mw == -INFINITY ? 0.0f : exp2f(mw - big);
      o = fmaf(c, s_o[w * o_warp + h * o_head + d], o);
      sum = fmaf(c, s_l[w * ml_warp + h], sum);
    }
    const int64_t slot = (head0 + h) * p.splits + split;
    p.part_o[slot * p.d + d] = o;
    if (d == 0) {
      p.part_ml[2 * slot] = big;
      p.part_ml[2 * slot + 1] = sum;
    }
  }
}

inline int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : t.size(-1); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  int64_t chunk, splits;
};
// Splits so that about kWaves waves of `blocks_per_sm` resident blocks per SM are launched, each
// split at least kMinChunk keys (rounded to the tile) of the longest possible sequence. Tuning
// runs override kMinChunk with OPFORGE_CUDA_DECODE_MIN_CHUNK=16..4096.
inline Plan plan_splits(int64_t sms, int64_t blocks_per_sm, int64_t pairs, int64_t max_ctx,
                        int64_t tile) {
  static const int forced_chunk = env_choice("OPFORGE_CUDA_DECODE_MIN_CHUNK", 16, 4096);
  const int64_t target = std::max<int64_t>(1, sms) * blocks_per_sm * kWaves;
  const int64_t min_chunk = ceil_div(forced_chunk ? forced_chunk : kMinChunk, tile) * tile;
  int64_t splits = std::max<int64_t>(1, ceil_div(target, pairs));
  splits = std::min({splits, std::max<int64_t>(1, ceil_div(max_ctx, min_chunk)), kMaxSplits});
  const int64_t chunk = ceil_div(std::max<int64_t>(1, ceil_div(max_ctx, splits)), tile) * tile;
  return {chunk, std::max<int64_t>(1, ceil_div(max_ctx, chunk))};
}

// Wave-balanced splits (cuda_split_mma). With `slots` = SMs x resident blocks, a launch of
// pairs * s blocks of u = ceil(units / s) tiles each runs in about w = ceil(pairs * s / slots)
// waves, so its time grows with w * (u + kBlockCost): kBlockCost tiles' worth of time is what a
// block pays besides its tiles (filling its copy pipeline, the merge, the partial state it writes
// and the combine reads). This picks the s in [1, units / min tiles] that minimizes it, the fewest
// splits among equals. Against plan_splits' fixed target of blocks no wave is left a sliver full:
// at GQA 32/8, context 2048, 132 SMs x 2 slots, batch 32 gets one wave of 256 blocks of 32 tiles
// instead of 5 waves of 7, and the time grows about linearly with batch x context instead of by
// wave steps.
// kBlockCost = 2, measured (H200, GQA 32/8, context 2048, every batch 1-256 against forced split
// counts 1-22, docs/perf/gpu-h200-2026-11-27-round11.md): with 1, batch 12 (96 pairs) took three
// waves of 4 tiles (41.2 us) where one wave of 16 took 35.4, slower than batch 16 (40.6 us); with
// 2 it takes the single wave and every other batch keeps its plan. The same pair count (GQA 16/2
// at batch 48) made the stored times non-monotone in batch.
constexpr int64_t kBlockCost = 2;

inline Plan plan_balanced(int64_t sms, int64_t blocks_per_sm, int64_t pairs, int64_t max_ctx,
                          int64_t tile) {
  static const int forced_chunk = env_choice("OPFORGE_CUDA_DECODE_MIN_CHUNK", 16, 4096);
  static const int64_t forced_splits = [] {
    const char* e = std::getenv("OPFORGE_CUDA_DECODE_SPLITS");
    const int64_t n = e ? std::atoll(e) : 0;
    return n >= 1 ? std::min(n, kMaxSplits) : int64_t(0);
  }();
  const int64_t slots = std::max<int64_t>(1, sms) * blocks_per_sm;
  const int64_t units = std::max<int64_t>(1, ceil_div(max_ctx, tile));
  if (forced_splits) {
    const int64_t chunk = ceil_div(units, std::min(forced_splits, units)) * tile;
    return {chunk, ceil_div(max_ctx, chunk)};
  }
  // At least kMinChunk keys a split, except that a sequence of >= 2 tiles may always split in two:
  // with 4 tiles at least, context 384 (6 tiles) ran as one block and took longer than 512 (two
  // blocks of 4) at every batch below a wave, a step the perf database could not interpolate.
  const int64_t min_units = std::min(std::max<int64_t>(1, ceil_div(forced_chunk ? forced_chunk : kMinChunk, tile)),
                                     std::max<int64_t>(1, ceil_div(units, 2)));
  int64_t best = 1, best_cost = ceil_div(pairs, slots) * (units + kBlockCost);
  for (int64_t s = 2; s <= kMaxSplits; ++s) {
    const int64_t per = ceil_div(units, s);
    if (per < min_units) break;
    const int64_t cost = ceil_div(pairs * s, slots) * (per + kBlockCost);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  const int64_t chunk = ceil_div(units, best) * tile;
  return {chunk, ceil_div(max_ctx, chunk)};
}

// The checks every split kernel's predicate shares, after its own dtype, head_dim and group
// checks: the grid bound, int32 lengths, 16-byte rows of q and the caches (head_dim d).
inline const char* split_inputs_problem(const TensorView& q, const TensorView& k_cache,
                                        const TensorView& v_cache, const TensorView& seq_lens,
                                        int64_t d) {
  if (q.size(0) * k_cache.size(2) > kMaxPairs) return "batch * kv heads > 2^20";
  if (seq_lens.dtype != DType::i32) return "seq_lens is not int32";
  for (const TensorView* t : {&q, &k_cache, &v_cache})
    if (const char* why = pack_rows_problem(*t, d)) return why;
  return nullptr;
}

// The argument block of one call, without the plan and the workspace.
template <class T>
SplitArgs<T> make_args(const TensorView& out, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& seq_lens, double softmax_scale) {
  SplitArgs<T> p{};
  p.out = out.ptr<T>(), p.q = q.ptr<T>(), p.k = k.ptr<T>(), p.v = v.ptr<T>();
  p.lens = static_cast<const int32_t*>(seq_lens.data);
  p.out_rs = row_stride_of(out), p.q_rs = row_stride_of(q);
  p.k_rs = row_stride_of(k), p.v_rs = row_stride_of(v);
  p.hq = q.size(1), p.hkv = k.size(2), p.group = p.hq / p.hkv, p.d = q.size(2), p.max_ctx = k.size(1);
  p.scale_log2 = float(attention_scale(softmax_scale, p.d)) * kLog2e;
  return p;
}

// Sets the plan (plan_balanced or plan_splits) into p and points it at the stream's workspace (Note [cuda workspace]); returns
// the partial kernel's block count (batch * Hkv * splits).
template <class T>
int64_t plan_partials(const Context& ctx, SplitArgs<T>& p, int64_t batch, int64_t blocks_per_sm,
                      int64_t tile, bool balanced = false) {
  const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
  const int64_t pairs = batch * p.hkv;
  const Plan plan = balanced ? plan_balanced(sms, blocks_per_sm, pairs, p.max_ctx, tile)
                             : plan_splits(sms, blocks_per_sm, pairs, p.max_ctx, tile);
  p.chunk = plan.chunk, p.splits = plan.splits;
  const int64_t entries = batch * p.hq * plan.splits;
  auto* ws = static_cast<float*>(cuda_workspace(ctx, entries * (p.d + 2) * int64_t(sizeof(float))));
  p.part_o = ws;
  p.part_ml = ws + entries * p.d;
  return batch * p.hkv * plan.splits;
}

template <class T> void launch_combine(const Context& ctx, const SplitArgs<T>& p, int64_t batch) {
  split_combine_kernel<T><<<unsigned(batch * p.hq), kCombineThreads, 0, stream_of(ctx)>>>(p);
  check_launch("attention_decode split combine kernel launch");
}

}  // namespace
}  // namespace opforge::cuda::attention_split
