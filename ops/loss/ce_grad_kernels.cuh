// Device code of cross_entropy_with_grad's cluster kernels (host side, plans and the notes they
// follow: ops/loss/cuda_fused.cu, Note [ce with grad clusters], Note [ce with grad, exp once], Note
// [ce with grad, few rows]). Included by cuda_fused.cu only.
#pragma once

#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge::cuda::loss::ce_grad {

namespace cg = cooperative_groups;
using namespace cuda::rows;  // NOLINT: UnitOf, Stats, add_unit, exp_shifted, merge_all, row_stats, row_sum

constexpr int kThreads = 256;    // threads of a CTA
constexpr int kMaxCluster = 8;   // the portable cluster size limit
constexpr int kStageBatch = 4;   // single-element staging: loads in flight a thread


__device__ __forceinline__ float cap(float x, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
}

// FusedArgs: ops/loss/loss_cuda.cuh.

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

}  // namespace opforge::cuda::loss::ce_grad
