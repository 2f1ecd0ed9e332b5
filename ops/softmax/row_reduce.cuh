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
  // The unit at p when `in`, else W copies of `fill` (the neutral value of units past the row's
  // end). Packs select their four 32-bit words: a select per 16-bit element split the raw pack
  // into halves (PRMTs, and spills in the register-cached kernels).
  static __device__ __forceinline__ Raw load_or(const T* p, bool in, float fill) {
    if constexpr (kVec) {
      T f[width];
#pragma unroll
      for (int j = 0; j < width; ++j) f[j] = from_f32<T>(fill);
      uint4 fw;
      __builtin_memcpy(&fw, f, sizeof(fw));
      const uint4 w = in ? *reinterpret_cast<const uint4*>(p) : fw;
      Raw r;
      __builtin_memcpy(&r, &w, sizeof(r));
      return r;
    } else {
      return in ? *p : from_f32<T>(fill);
    }
  }
  // r, as a value the compiler cannot prove equal to r: widening it again later does not reuse
  // (and keep live) the f32 values of an earlier widen of the same unit.
  static __device__ __forceinline__ Raw opaque(const Raw& r) {
    if constexpr (sizeof(Raw) == 16) {
      uint4 w;
      __builtin_memcpy(&w, &r, sizeof(w));
      asm volatile("" : "+r"(w.x), "+r"(w.y), "+r"(w.z), "+r"(w.w));
      Raw o;
      __builtin_memcpy(&o, &w, sizeof(o));
      return o;
    } else {
      return r;
    }
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

// exp2_ftz, log2_ftz, kLog2e, kLn2: Note [element exp] in backends/cuda/cuda_launch.cuh.
template <class T> __device__ __forceinline__ float exp_of(float x) {
  if constexpr (std::is_same_v<T, float>) return expf(x);
  else return exp2_ftz(x * kLog2e);
}

// exp(x - shift) with shift2 = shift * log2(e) given, for data of type T. f32: expf(x - shift) as
// exp_of. f16 / bf16: exp2_ftz of one FFMA, x log2(e) - shift2, one instruction fewer than
// exp_of(x - shift) (a subtraction, then the multiply); folding the subtraction changes the
// result by about |shift| 2^-24 relative, far under the 2^-8 / 2^-11 spacing it is rounded to.
template <class T> __device__ __forceinline__ float exp_shifted(float x, float shift, float shift2) {
  if constexpr (std::is_same_v<T, float>) return expf(x - shift);
  else return exp2_ftz(fmaf(x, kLog2e, -shift2));
}

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
// rescaled: a partial's sum at the common max m (0 for an empty partial). T: the data's type, whose
// exp_of the rescaling takes (16-bit data: one ex2.approx where expf is ~20 instructions; the
// merges of a few-row kernel are a quarter of its instructions with expf).
template <class T = float> __device__ __forceinline__ float rescaled(Stats p, float m) {
  return p.m == -INFINITY ? 0.0f : p.s * exp_of<T>(p.m - m);
}
// The merge of n >= 1 partials in order: the same value as folding merge() over them up to
// rounding, with the exps off each other's critical path.
template <class T = float> __device__ __forceinline__ Stats merge_all(const Stats* p, int n) {
  float m = p[0].m;
  for (int i = 1; i < n; ++i) m = fmaxf(m, p[i].m);
  if (m == -INFINITY) return {m, 0.0f};
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += rescaled<T>(p[i], m);
  return {m, s};
}
// One unit's values into the online statistics (the running sum rescaled in T's precision).
template <class T, int W>
__device__ __forceinline__ Stats add_unit(Stats st, const float (&v)[W]) {
  float um = v[0];
#pragma unroll
  for (int j = 1; j < W; ++j) um = fmaxf(um, v[j]);
  const float m = fmaxf(st.m, um);
  if (m == -INFINITY) return st;
  float s = st.m == m ? st.s : st.s * exp_of<T>(st.m - m);
  const float m2 = m * kLog2e;
#pragma unroll
  for (int j = 0; j < W; ++j) s += exp_shifted<T>(v[j], m, m2);
  return {m, s};
}

// Reduces a[0..N) with `op` in a fixed pairwise tree (a[0] holds the result): log2(N) dependent
// steps instead of N - 1, the independent ones issued back to back. A sequential fold over a
// thread's 64 register-held values made each FMNMX / FADD wait on the one before it, and with two
// warps a scheduler nothing else was there to issue in the wait.
template <int N, class Op> __device__ __forceinline__ float tree_reduce(float (&a)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) a[i] = op(a[i], a[i + w]);
  return a[0];
}

// Statistics of the K units of W values a thread holds in registers (as f32; units past the row
// hold -inf): the max first, a tree with no exp in it, then the sum of exp(x - max) in a tree,
// every exp independent of the others. add_unit's online rescaling instead runs one dependent
// chain (max, exp, sum) through every unit, which is what bounds a thread that holds a whole
// segment of a row at once. kKeep: each value is replaced by its exp(x - max) (the thread's max,
// returned in .m; -inf for a thread with no value, whose exps are then 0).
template <class T, bool kKeep, int K, int W> __device__ __forceinline__ Stats cached_stats(float (&v)[K][W]) {
  float t[K * W];
#pragma unroll
  for (int i = 0; i < K * W; ++i) t[i] = v[i / W][i % W];
  const float m = tree_reduce(t, [](float a, float b) { return fmaxf(a, b); });
  const float shift = m == -INFINITY ? 0.0f : m, shift2 = shift * kLog2e;
#pragma unroll
  for (int i = 0; i < K * W; ++i) {
    t[i] = exp_shifted<T>(v[i / W][i % W], shift, shift2);
    if constexpr (kKeep) v[i / W][i % W] = t[i];
  }
  return {m, tree_reduce(t, [](float a, float b) { return a + b; })};
}

// Reductions over the `rt` threads of a row (a power of two, 32 <= rt <= 1024; the rows of a
// block are consecutive groups of rt threads). Warp butterflies first (row_stats: the max, then
// the rescaled sums, Note [max first]); for rt > 32 the warp partials go through shared memory
// (`scratch`: one slot per warp of the block) and every thread of the row merges its row's
// partials in warp order. Every thread of the row ends with the same bits (fmax and + are
// commutative). Every thread of the block must call it (barriers).
template <class T = float> __device__ __forceinline__ Stats row_stats(Stats st, int rt, Stats* scratch) {
  float m = st.m;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  float s = rescaled<T>(st, m);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (rt == 32) return {m, s};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, first = (int(threadIdx.x) / rt) * (rt / 32);
  if (lane == 0) scratch[warp] = Stats{m, s};
  __syncthreads();
  const Stats total = merge_all<T>(scratch + first, rt / 32);
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
