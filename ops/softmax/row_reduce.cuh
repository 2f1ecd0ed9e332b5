// Device helpers of row-wise kernels with softmax statistics (ops/softmax/cuda.cu,
// ops/loss/cuda.cu): units of 16-byte packs or single elements, online (max, sum of exp) merged
// in a fixed order, and reductions over the threads of one row.
#pragma once

#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"

namespace opforge::cuda::rows {

// A unit: a 16-byte pack (kVec) or one element. Raw units are what the register cache keeps
// (16 bytes = 4 registers a pack); Floats are their f32 values for the math.
template <class T, bool kVec> struct UnitOf {
  static constexpr int width = kVec ? Pack<T>::n : 1;
  using Raw = std::conditional_t<kVec, Pack<T>, T>;
  struct Floats {
    float v[width];
  };
  static __device__ __forceinline__ Raw load(const T* p) {
    if constexpr (kVec) return load_pack(p);
    else return *p;
  }
  static __device__ __forceinline__ Floats widen(const Raw& r) {
    Floats f;
    if constexpr (kVec && std::is_same_v<T, __nv_bfloat16>) {
      // bf16 is the top half of an f32: widen each 32-bit word of the pack with a shift and a
      // mask, so the raw pack stays four registers (element-wise conversion let the compiler
      // split it into eight 16-bit values and spill the register-cached rows).
      uint32_t w[4];
      __builtin_memcpy(w, &r, sizeof(w));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f.v[2 * i] = __uint_as_float(w[i] << 16);
        f.v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
    } else if constexpr (kVec) {
#pragma unroll
      for (int j = 0; j < width; ++j) f.v[j] = to_f32(r.v[j]);
    } else {
      f.v[0] = to_f32(r);
    }
    return f;
  }
  static __device__ __forceinline__ void store(T* p, const Floats& f) {
    if constexpr (kVec) {
      Pack<T> pack;
#pragma unroll
      for (int j = 0; j < width; ++j) pack.v[j] = from_f32<T>(f.v[j]);
      store_pack(p, pack);
    } else {
      *p = from_f32<T>(f.v[0]);
    }
  }
};

// Online softmax statistics: the running max and the sum of exp(x - max).
struct Stats {
  float m, s;
};
__device__ __forceinline__ Stats merge(Stats a, Stats b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty (or all -inf)
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
// Note [max first]: (max, sum) partials are combined by taking the max over all of them first
// (fmax butterflies, no exp) and then adding each sum rescaled by exp(its max - the max): one exp
// per partial, all independent. Folding merge() pairwise instead puts two exps on the critical
// path of every butterfly level and of every further partial (5 levels + 8 warps + 8 ranks:
// about 40 dependent accurate exps, a microsecond of latency in a few-row kernel).
// rescaled: a partial's sum at the common max m (0 for an empty partial).
inline __device__ float rescaled(Stats p, float m) { return p.m == -INFINITY ? 0.0f : p.s * expf(p.m - m); }
// The merge of n >= 1 partials in order: the same value as folding merge() over them up to
// rounding, with the exps off each other's critical path.
inline __device__ Stats merge_all(const Stats* p, int n) {
  float m = p[0].m;
  for (int i = 1; i < n; ++i) m = fmaxf(m, p[i].m);
  if (m == -INFINITY) return {m, 0.0f};
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += rescaled(p[i], m);
  return {m, s};
}
// Note [element exp]: exp of an element in the precision its type needs. f32 data gets the
// accurate expf (a ~20-instruction polynomial; the f32 results must match the reference to a few
// ulps). bf16 / f16 data gets __expf (ex2.approx on the special-function unit: relative error
// below ~2^-21 + 1e-7 |x|, far under the 2^-8 / 2^-11 spacing the result is rounded to), which
// keeps these memory-bound kernels from becoming bound by the exp instead.
template <class T> __device__ __forceinline__ float exp_of(float x) {
  if constexpr (std::is_same_v<T, float>) return expf(x);
  else return __expf(x);
}

// exp(x - shift) with shift2 = shift * log2(e) given, for data of type T. f32: expf(x - shift) as
// exp_of. f16 / bf16: ex2.approx of one FFMA, x log2(e) - shift2, which is what __expf(x - shift)
// computes with one instruction more (a subtraction, then the multiply); folding the subtraction
// changes the result by about |shift| 2^-24 relative, far under the 2^-8 / 2^-11 spacing it is
// rounded to. For kernels close to issue-bound (cross_entropy_with_grad, ops/loss/cuda_fused.cu).
constexpr float kLog2e = 1.4426950408889634f;
template <class T> __device__ __forceinline__ float exp_shifted(float x, float shift, float shift2) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x - shift);
  } else {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, kLog2e, -shift2)));
    return y;
  }
}

// One unit's values into the online statistics. kFolded: exp_shifted instead of exp_of.
template <class T, int W, bool kFolded = false>
__device__ __forceinline__ Stats add_unit(Stats st, const float (&v)[W]) {
  float um = v[0];
#pragma unroll
  for (int j = 1; j < W; ++j) um = fmaxf(um, v[j]);
  const float m = fmaxf(st.m, um);
  if (m == -INFINITY) return st;
  float s = st.m == m ? st.s : st.s * expf(st.m - m);
  const float m2 = m * kLog2e;
#pragma unroll
  for (int j = 0; j < W; ++j) s += kFolded ? exp_shifted<T>(v[j], m, m2) : exp_of<T>(v[j] - m);
  return {m, s};
}

// Statistics of the `live` first of K units a thread holds in registers (as f32): the max first,
// a tree with no exp in it, then the sum of exp(x - max), every exp independent of the others.
// add_unit's online rescaling instead runs one dependent chain (max, exp, sum) through every unit,
// which is what bounds a thread that holds a whole segment of a row at once.
template <class T, int K, int W>
__device__ __forceinline__ Stats cached_stats(const float (&v)[K][W], int live) {
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < K; ++c)
    if (c < live)
#pragma unroll
      for (int j = 0; j < W; ++j) m = fmaxf(m, v[c][j]);
  if (m == -INFINITY) return {m, 0.0f};
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < K; ++c) {
    if (c >= live) continue;
    float us = 0.0f;
#pragma unroll
    for (int j = 0; j < W; ++j) us += exp_of<T>(v[c][j] - m);
    s += us;
  }
  return {m, s};
}

// Reductions over the `rt` threads of a row (a power of two, 32 <= rt <= 1024; the rows of a
// block are consecutive groups of rt threads). Warp butterflies first (row_stats: the max, then
// the rescaled sums, Note [max first]); for rt > 32 the warp partials go through shared memory
// (`scratch`: one slot per warp of the block) and every thread of the row merges its row's
// partials in warp order. Every thread of the row ends with the same bits (fmax and + are
// commutative). Every thread of the block must call it (barriers).
inline __device__ Stats row_stats(Stats st, int rt, Stats* scratch) {
  float m = st.m;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  float s = rescaled(st, m);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (rt == 32) return {m, s};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, first = (int(threadIdx.x) / rt) * (rt / 32);
  if (lane == 0) scratch[warp] = Stats{m, s};
  __syncthreads();
  const Stats total = merge_all(scratch + first, rt / 32);
  __syncthreads();
  return total;
}
inline __device__ float row_sum(float v, int rt, float* scratch) {
  v = group_sum<32>(v);
  if (rt == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, first = (int(threadIdx.x) / rt) * (rt / 32);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = scratch[first];
  for (int w = 1; w < rt / 32; ++w) total += scratch[first + w];
  __syncthreads();
  return total;
}

}  // namespace opforge::cuda::rows
