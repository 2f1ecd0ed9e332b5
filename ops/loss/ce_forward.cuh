// The cross_entropy forward's per-row pieces shared by its CUDA kernels (ops/loss/cuda.cu,
// ops/loss/cuda_pipeline.cu): the options, the launch arguments, a thread's scan of its units of a
// row into the online statistics, and a row's finish (lse and loss) by one thread.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/softmax/cluster_row.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge::cuda::loss {

using rows::add_unit;
using rows::Stats;
using rows::UnitOf;

struct Options {
  int64_t ignore_index;
  float smoothing, z_scale, softcap;  // z_scale: lse_square_scale
};
__device__ __forceinline__ float cap(float x, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
}

// The f32 values of a thread's units of a cluster row segment (ops/softmax/cluster_row.cuh),
// softcapped when kMaybeCap (cap: a softcap of 0 leaves them), -inf past the segment's end (exp 0
// after the softcap too), and each unit's sum of z over in-segment values only (a masked -inf
// logit makes it -inf, as in the reference).
template <class U, int kUnits, int kThreads, bool kMaybeCap>
__device__ __forceinline__ void widen_segment(const typename U::Raw (&raw)[kUnits], const rows::ClusterRow& seg,
                                              float softcap, float (&v)[kUnits][U::width], float (&zs)[kUnits]) {
#pragma unroll
  for (int c = 0; c < kUnits; ++c) {
    const bool in = seg.begin + threadIdx.x + int64_t(c) * kThreads < seg.end;
    const typename U::Floats f = U::widen(raw[c]);
    zs[c] = 0.0f;
#pragma unroll
    for (int j = 0; j < U::width; ++j) {
      v[c][j] = in ? (kMaybeCap ? cap(f.v[j], softcap) : f.v[j]) : -INFINITY;
      if (in) zs[c] += v[c][j];
    }
  }
}

template <class T> struct ForwardArgs {
  const T* logits;
  int64_t logits_stride, rows, vocab;
  const int64_t* target;
  int64_t target_stride;
  float* loss;  // [rows] (none) or the workspace (sum / mean)
  int64_t loss_stride;
  float* lse;
  int64_t lse_stride;
  Options o;
};

// One thread's share of a row: units u, u + step, ... below `end`, softcap applied, into the
// online (max, sum of exp) and sum(z). Four loads are issued before the first is used, so a
// thread keeps four 16-byte requests in flight instead of waiting out each one (what bounds a
// row scan when a block has only a few units per thread). kGuardedTail: the last, partial batch
// too, guarded loads issued together; else the tail goes one unit at a time, a round trip each
// (Note [plain row scan] in ops/loss/cuda.cu says which kernel takes which). kPlain: no softcap
// and no label smoothing, so no cap per element and no sum(z) (sum_z is left untouched). The
// order of the adds is the order of u either way.
template <class T, bool kVec, bool kGuardedTail, bool kPlain = false>
__device__ __forceinline__ void scan_units(const T* x, int64_t u, int64_t end, int64_t step, float softcap,
                                           Stats& st, float& sum_z) {
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width, kInFlight = 4;
  auto consume = [&](const typename U::Raw& raw) {
    typename U::Floats z = U::widen(raw);
    if constexpr (!kPlain) {
#pragma unroll
      for (int j = 0; j < W; ++j) {
        z.v[j] = cap(z.v[j], softcap);
        sum_z += z.v[j];
      }
    }
    st = add_unit<T>(st, z.v);
  };
  for (; u + (kInFlight - 1) * step < end; u += kInFlight * step) {
    typename U::Raw raw[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) raw[k] = U::load(x + (u + k * step) * W);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) consume(raw[k]);
  }
  if constexpr (kGuardedTail) {
    if (u < end) {  // the last, partial batch: guarded loads, still issued together
      typename U::Raw raw[kInFlight - 1];
#pragma unroll
      for (int k = 0; k < kInFlight - 1; ++k)
        if (u + k * step < end) raw[k] = U::load(x + (u + k * step) * W);
#pragma unroll
      for (int k = 0; k < kInFlight - 1; ++k)
        if (u + k * step < end) consume(raw[k]);
    }
  } else {
    for (; u < end; u += step) consume(U::load(x + u * W));
  }
}

// A row's target and its (softcapped) logit; zt is NaN when the target is out of range, 0 when
// the row is ignored.
template <class T>
__device__ __forceinline__ void load_target(const ForwardArgs<T>& p, int64_t row, int64_t& t, float& zt) {
  t = p.target[row * p.target_stride];
  zt = t == p.o.ignore_index ? 0.0f
       : (t < 0 || t >= p.vocab) ? NAN
                                 : cap(to_f32(p.logits[row * p.logits_stride + t]), p.o.softcap);
}

// A row's lse and loss from its statistics and target (one thread).
template <class T>
__device__ __forceinline__ float finish_row(const ForwardArgs<T>& p, int64_t row, Stats st, float sum_z, int64_t t,
                                            float zt) {
  const float lse = st.m + logf(st.s);
  p.lse[row * p.lse_stride] = lse;
  float loss = 0.0f;
  if (t != p.o.ignore_index) {
    const float eps = p.o.smoothing / float(p.vocab);
    loss = (1.0f - p.o.smoothing) * (lse - zt) + p.o.z_scale * lse * lse;
    // The smoothing terms only with smoothing, as the reference adds them: masked (-inf) logits
    // make sum_z -inf, and 0 * -inf would turn such a row's loss NaN.
    if (p.o.smoothing > 0.0f) loss += p.o.smoothing * lse - eps * sum_z;
  }
  p.loss[row * p.loss_stride] = loss;
  return loss;
}

// Note [cross_entropy row pipeline] (ops/loss/cuda_pipeline.cu): the forward at many rows of
// 16-byte packs (`units` a row) that one CTA's shared-memory ring holds, where the row kernel
// would launch `row_kernel_blocks` blocks; false when it does not take the call.
template <class T>
bool launch_forward_pipeline(const Context& ctx, const ForwardArgs<T>& p, int64_t units, int64_t row_kernel_blocks);

}  // namespace opforge::cuda::loss
