// CUDA kernel of attention_prefill_backward: gradients of variable-length causal / windowed GQA
// attention from the forward's saved out and lse (the op's doc gives the formulas).
//
// Three launches on the caller's stream, all deterministic (no atomics; every sum runs in a fixed
// order), f32 math, one rounding per output element:
//  1. delta[h, i] = dout_i,h . out_i,h into the backend workspace (f32, [Hq, T]; Note [cuda
//     workspace]); one warp per (query, head), lanes split head_dim, warp butterfly.
//  2. dq: one warp per (query i, head h) walks the keys i sees (prefill_mask.cuh): for each key j
//     the two dot products s = q_i . k_j and dp = dout_i . v_j (lanes split head_dim, one paired
//     butterfly), p = exp(scale s - lse_i), ds = p (dp - delta_i), dq_i += ds k_j; dq_i *= scale.
//  3. dk, dv: one warp per (key j, kv head g) walks the query heads of g's group and, for each, the
//     queries that see j: dv_j += p dout_i, dk_j += ds q_i; dk_j *= scale. The GQA sum over the
//     group happens inside the warp, so no two warps write the same row.
// Output columns are held in registers in chunks of 256 (8 a lane); head_dim > 256 repeats the
// walk per chunk (any head_dim works). Masks on global token indices with clamped offsets, as in
// the forward; 64-bit offsets throughout. The walk reads q, k, v and dout rows through L1/L2; no
// tensor cores: this kernel is the correct baseline, not the fast path.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/prefill_mask.cuh"

namespace opforge {
namespace cuda::attention_prefill {
namespace {

constexpr int kWarps = 4;
constexpr int kChunk = 8;  // output elements a lane holds per pass: 256 columns

template <class T> struct BwdArgs {
  T* dq;
  T* dk;
  T* dv;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const T* out;
  const float* lse;  // [Hq, T]
  float* delta;      // [Hq, T], workspace
  int64_t dq_rs, dk_rs, dv_rs, dout_rs, q_rs, k_rs, v_rs, out_rs;
  int64_t tokens, hq, hkv, d;
  Seqs seqs;
  bool causal;
  int64_t window_left;
  float scale;
};

template <class T> __device__ __forceinline__ const T* row(const T* base, int64_t t, int64_t heads, int64_t h, int64_t rs) {
  return base + (t * heads + h) * rs;
}
template <class T> __device__ __forceinline__ T* row(T* base, int64_t t, int64_t heads, int64_t h, int64_t rs) {
  return base + (t * heads + h) * rs;
}

// (a . b, c . e) over head_dim, lanes strided, the same bits in every lane.
template <class T>
__device__ __forceinline__ float2 dot2(const T* a, const T* b, const T* c, const T* e, int64_t d, int lane) {
  float2 acc = make_float2(0.0f, 0.0f);
  for (int64_t x = lane; x < d; x += 32) {
    acc.x = fmaf(to_f32(a[x]), to_f32(b[x]), acc.x);
    acc.y = fmaf(to_f32(c[x]), to_f32(e[x]), acc.y);
  }
  return warp_sum2(acc);
}

template <class T> __global__ void __launch_bounds__(kWarps * 32) delta_kernel(BwdArgs<T> p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp, h = blockIdx.y;
  if (i >= p.tokens) return;  // the whole warp leaves
  const T* o = row(p.out, i, p.hq, h, p.out_rs);
  const T* g = row(p.dout, i, p.hq, h, p.dout_rs);
  float s = 0.0f;
  for (int64_t x = lane; x < p.d; x += 32) s = fmaf(to_f32(o[x]), to_f32(g[x]), s);
  s = group_sum<32>(s);
  if (lane == 0) p.delta[h * p.tokens + i] = s;
}

template <class T> __global__ void __launch_bounds__(kWarps * 32) dq_kernel(BwdArgs<T> p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp, h = blockIdx.y;
  if (i >= p.tokens) return;  // the whole warp leaves
  const int64_t g = h / (p.hq / p.hkv);
  const Range r = key_range(p.seqs, i, p.causal, p.window_left);
  const T* qi = row(p.q, i, p.hq, h, p.q_rs);
  const T* gi = row(p.dout, i, p.hq, h, p.dout_rs);
  const float lse_i = p.lse[h * p.tokens + i], delta_i = p.delta[h * p.tokens + i];
  T* dqi = row(p.dq, i, p.hq, h, p.dq_rs);
  for (int64_t c0 = 0; c0 < p.d; c0 += 32 * kChunk) {
    float acc[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc[e] = 0.0f;
    for (int64_t j = r.lo; j < r.hi; ++j) {
      const T* kj = row(p.k, j, p.hkv, g, p.k_rs);
      const T* vj = row(p.v, j, p.hkv, g, p.v_rs);
      const float2 sd = dot2(qi, kj, gi, vj, p.d, lane);
      const float pij = expf(p.scale * sd.x - lse_i);
      const float ds = pij * (sd.y - delta_i);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int64_t x = c0 + lane + 32 * e;
        if (x < p.d) acc[e] = fmaf(ds, to_f32(kj[x]), acc[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t x = c0 + lane + 32 * e;
      if (x < p.d) dqi[x] = from_f32<T>(acc[e] * p.scale);
    }
  }
}

template <class T> __global__ void __launch_bounds__(kWarps * 32) dkdv_kernel(BwdArgs<T> p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = int64_t(blockIdx.x) * kWarps + warp, g = blockIdx.y;
  if (j >= p.tokens) return;  // the whole warp leaves
  const int64_t group = p.hq / p.hkv;
  const Range r = query_range(p.seqs, j, p.causal, p.window_left);
  const T* kj = row(p.k, j, p.hkv, g, p.k_rs);
  const T* vj = row(p.v, j, p.hkv, g, p.v_rs);
  T* dkj = row(p.dk, j, p.hkv, g, p.dk_rs);
  T* dvj = row(p.dv, j, p.hkv, g, p.dv_rs);
  for (int64_t c0 = 0; c0 < p.d; c0 += 32 * kChunk) {
    float adk[kChunk], adv[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) adk[e] = 0.0f, adv[e] = 0.0f;
    for (int64_t hh = 0; hh < group; ++hh) {
      const int64_t h = g * group + hh;
      for (int64_t i = r.lo; i < r.hi; ++i) {
        const T* qi = row(p.q, i, p.hq, h, p.q_rs);
        const T* gi = row(p.dout, i, p.hq, h, p.dout_rs);
        const float2 sd = dot2(qi, kj, gi, vj, p.d, lane);
        const float pij = expf(p.scale * sd.x - p.lse[h * p.tokens + i]);
        const float ds = pij * (sd.y - p.delta[h * p.tokens + i]);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const int64_t x = c0 + lane + 32 * e;
          if (x < p.d) {
            adv[e] = fmaf(pij, to_f32(gi[x]), adv[e]);
            adk[e] = fmaf(ds, to_f32(qi[x]), adk[e]);
          }
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t x = c0 + lane + 32 * e;
      if (x < p.d) {
        dkj[x] = from_f32<T>(adk[e] * p.scale);
        dvj[x] = from_f32<T>(adv[e]);
      }
    }
  }
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : t.size(-1); }

void run(const Context& ctx, const TensorView& dq, const TensorView& dk, const TensorView& dv,
         const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& out, const TensorView& lse, const TensorView& cu, bool causal,
         double softmax_scale, int64_t window_left) {
  const int64_t tokens = q.size(0), hq = q.size(1), hkv = k.size(1), d = q.size(2);
  if (tokens == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(q.dtype, "attention_prefill_backward", [&](auto tag) {
    using T = decltype(tag);
    BwdArgs<T> p{};
    p.dq = dq.ptr<T>(), p.dk = dk.ptr<T>(), p.dv = dv.ptr<T>();
    p.dout = dout.ptr<T>(), p.q = q.ptr<T>(), p.k = k.ptr<T>(), p.v = v.ptr<T>(), p.out = out.ptr<T>();
    p.lse = static_cast<const float*>(lse.data);
    p.dq_rs = row_stride_of(dq), p.dk_rs = row_stride_of(dk), p.dv_rs = row_stride_of(dv);
    p.dout_rs = row_stride_of(dout), p.q_rs = row_stride_of(q), p.k_rs = row_stride_of(k);
    p.v_rs = row_stride_of(v), p.out_rs = row_stride_of(out);
    p.tokens = tokens, p.hq = hq, p.hkv = hkv, p.d = d;
    p.seqs = seqs_of(cu, tokens);
    p.causal = causal, p.window_left = window_left;
    p.scale = float(attention_scale(softmax_scale, d));
    const unsigned blocks = grid_for(tokens, kWarps);
    const cudaStream_t stream = stream_of(ctx);
    if (hq > 0) {
      p.delta = static_cast<float*>(cuda_workspace(ctx, hq * tokens * int64_t(sizeof(float))));
      delta_kernel<T><<<dim3(blocks, unsigned(hq)), kWarps * 32, 0, stream>>>(p);
      check_launch("attention_prefill_backward delta kernel launch");
      dq_kernel<T><<<dim3(blocks, unsigned(hq)), kWarps * 32, 0, stream>>>(p);
      check_launch("attention_prefill_backward dq kernel launch");
    }
    // With no query heads every dk, dv row is 0; the kernel writes them all either way.
    dkdv_kernel<T><<<dim3(blocks, unsigned(hkv)), kWarps * 32, 0, stream>>>(p);
    check_launch("attention_prefill_backward dk/dv kernel launch");
  });
}

}  // namespace
}  // namespace cuda::attention_prefill

void attention_prefill_backward_cuda(const Context& ctx, const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, const TensorView& dout,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse,
                                     const TensorView& cu_seqlens, bool causal,
                                     double softmax_scale, int64_t window_left) {
  cuda::attention_prefill::run(ctx, dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, causal,
                               softmax_scale, window_left);
}

const char* attention_prefill_backward_cuda_applicable(
    const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView& q,
    const TensorView& k, const TensorView&, const TensorView&, const TensorView& lse,
    const TensorView&, bool, double, int64_t) {
  if (!cuda::is_cuda_float(q.dtype)) return cuda::kNotCudaFloat;
  if (lse.dtype != DType::f32) return "lse is not f32";
  if (q.size(1) > 65535 || k.size(1) > 65535) return "more than 65535 query or kv heads";
  return nullptr;
}

void register_attention_prefill_backward_cuda(Registry& reg) {
  reg.add_kernel<AttentionPrefillBackward>(
      cuda_kernel_desc("cuda", 100,
                       "warp per query row (dq) and per key row (dk, dv, GQA group summed in the "
                       "warp), recomputed p from lse, f32, deterministic without atomics",
                       false),
      &attention_prefill_backward_cuda, &attention_prefill_backward_cuda_applicable);
}

}  // namespace opforge
