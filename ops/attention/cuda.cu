// CUDA kernel of attention_decode: one query token per sequence against a contiguous KV cache,
// split-K ("flash decoding") with grouped-query sharing. Impl `cuda`, element-wise loads, any
// dtype / head_dim <= 256 / row layout: the fallback of the 16-byte split kernels of
// cuda_decode.cu (cuda_split, cuda_split_async), which have higher priority.
//
// Math (the op's doc): out[b, h] = sum_{j < len_b} softmax_j(scale * q[b, h] . k[b, j, g]) v[b, j, g],
// g = h / (Hq / Hkv); a sequence of length 0 gives 0. seq_lens on the device are clamped to
// [0, max_ctx] (the check cannot read them without synchronizing), so no cache row past max_ctx is
// ever read; rows at or past len_b are never read either.
//
// Technique. Memory-bound: the K and V rows of every sequence are read once (GQA: the Hq / Hkv query
// heads of a kv head share each read).
//  1. Partial pass, grid (splits, Hkv, B), 128 threads = 4 warps. The block's split is a contiguous
//     chunk of the sequence's keys; warp w takes keys w, w + 4, ... of the chunk. For each key the
//     lanes split head_dim (lane-strided elements: each warp load is contiguous), compute the G
//     scores q_h . k (q pre-scaled, in f32 in shared memory) with a warp butterfly reduction, and
//     update an online softmax per head (running max m, sum l, accumulator acc[D] in registers, all
//     f32). The next key's K and V elements are loaded before the current key is reduced (a
//     two-stage register pipeline), so each warp keeps two keys' loads in flight. Each warp writes
//     its (m, l, acc) to the f32 workspace: B * Hq * (4 * splits) partial states.
//  2. Combine pass, grid (Hq, B): M = max m_s, out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,
//     in a fixed order (deterministic), rounded once to the dtype.
//  Launch shape from the SM count: splits = enough blocks for 4 per SM, at least 64 keys a split.
//  int64 offsets throughout ((b * max_ctx + j) * Hkv + g) * row_stride). Limits (the predicate says
//  which fails): head_dim <= 256 (8 elements a lane), Hq / Hkv <= 8. Scratch is the backend's
//  per-stream workspace (Note [cuda workspace]); no host synchronization, no allocation after the
//  first call of a size.
#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/attention/attention_cuda.h"

namespace opforge {
namespace cuda::attention {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256
constexpr int kMaxGroup = 8;

template <class T> struct DecodeArgs {
  T* out;
  const T* q;
  const T* k;
  const T* v;
  const int32_t* lens;
  float* partial;  // [B, Hq, slots, D + 2]: acc[D], m, l
  int64_t out_rs, q_rs, k_rs, v_rs;
  int64_t batch, hq, hkv, d, max_ctx;
  int splits, slots;  // slots = splits * kWarps
  float scale;
};

__device__ __forceinline__ int64_t clamp_len(int32_t n, int64_t max_ctx) {
  return n < 0 ? 0 : (int64_t(n) > max_ctx ? max_ctx : int64_t(n));
}

template <class T, int G>
__global__ void __launch_bounds__(kWarps * 32) decode_partial_kernel(DecodeArgs<T> p) {
  __shared__ float qs[kMaxGroup][kMaxPerLane * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.z, g = blockIdx.y;
  const int split = blockIdx.x;
  const int group = int(p.hq / p.hkv);
  const int64_t len = clamp_len(p.lens[b], p.max_ctx);
  const int64_t chunk = (len + p.splits - 1) / p.splits;
  const int64_t begin = std::min<int64_t>(int64_t(split) * chunk, len);
  const int64_t end = std::min<int64_t>(begin + chunk, len);

  for (int e = threadIdx.x; e < G * kMaxPerLane * 32; e += blockDim.x) {
    const int h = e / (kMaxPerLane * 32), d = e % (kMaxPerLane * 32);
    float v = 0.0f;
    if (h < group && d < p.d) v = to_f32(p.q[(b * p.hq + g * group + h) * p.q_rs + d]) * p.scale;
    qs[h][d] = v;
  }
  __syncthreads();

  float m[G], l[G], acc[G][kMaxPerLane];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[h][i] = 0.0f;
  }
  auto row_k = [&](int64_t j) { return p.k + ((b * p.max_ctx + j) * p.hkv + g) * p.k_rs; };
  auto row_v = [&](int64_t j) { return p.v + ((b * p.max_ctx + j) * p.hkv + g) * p.v_rs; };
  float kn[kMaxPerLane], vn[kMaxPerLane];
  auto load = [&](int64_t j) {
    const T* kr = row_k(j);
    const T* vr = row_v(j);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      kn[i] = d < p.d ? to_f32(kr[d]) : 0.0f;
      vn[i] = d < p.d ? to_f32(vr[d]) : 0.0f;
    }
  };
  int64_t j = begin + warp;
  if (j < end) load(j);
  for (; j < end; j += kWarps) {
    float kc[kMaxPerLane], vc[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) kc[i] = kn[i], vc[i] = vn[i];
    if (j + kWarps < end) load(j + kWarps);  // the next key's loads fly while this one reduces
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) s = fmaf(qs[h][lane + 32 * i], kc[i], s);
      s = group_sum<32>(s);
      const float m_new = fmaxf(m[h], s);
      const float corr = expf(m[h] - m_new);  // 0 on the first key (m = -inf)
      const float pj = expf(s - m_new);
      l[h] = l[h] * corr + pj;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) acc[h][i] = fmaf(acc[h][i], corr, pj * vc[i]);
      m[h] = m_new;
    }
  }

  const int slot = split * kWarps + warp;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h >= group) break;
    float* out = p.partial + ((b * p.hq + g * group + h) * p.slots + slot) * (p.d + 2);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < p.d) out[d] = acc[h][i];
    }
    if (lane == 0) out[p.d] = m[h], out[p.d + 1] = l[h];
  }
}

template <class T> __global__ void decode_combine_kernel(DecodeArgs<T> p) {
  const int64_t b = blockIdx.y, h = blockIdx.x;
  const float* base = p.partial + (b * p.hq + h) * p.slots * (p.d + 2);
  float big = -INFINITY;
  for (int s = 0; s < p.slots; ++s) big = fmaxf(big, base[s * (p.d + 2) + p.d]);
  T* out = p.out + (b * p.hq + h) * p.out_rs;
  for (int64_t d = threadIdx.x; d < p.d; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (big != -INFINITY) {
      for (int s = 0; s < p.slots; ++s) {
        const float* st = base + s * (p.d + 2);
        const float w = st[p.d] == -INFINITY ? 0.0f : expf(st[p.d] - big);
        num = fmaf(w, st[d], num);
        den = fmaf(w, st[p.d + 1], den);
      }
    }
    out[d] = from_f32<T>(den > 0.0f ? num / den : 0.0f);
  }
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : t.size(-1); }

template <class T, int G> void launch_partial(const Context& ctx, const DecodeArgs<T>& p) {
  const dim3 grid(unsigned(p.splits), unsigned(p.hkv), unsigned(p.batch));
  decode_partial_kernel<T, G><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
}

void run(const Context& ctx, const TensorView& out, const TensorView& q, const TensorView& k,
         const TensorView& v, const TensorView& seq_lens, double softmax_scale) {
  const int64_t batch = q.size(0), hq = q.size(1), d = q.size(2), hkv = k.size(2), max_ctx = k.size(1);
  if (batch == 0 || hq == 0 || d == 0) return;
  DeviceGuard guard(ctx.device.index);
  const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
  // Enough blocks for about 4 per SM, each split at least 64 keys (of the longest possible length).
  const int64_t pairs = batch * hkv;
  int64_t splits = std::max<int64_t>(1, (4 * sms + pairs - 1) / pairs);
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, max_ctx / 64), 64});
  dispatch_float(q.dtype, "attention_decode", [&](auto tag) {
    using T = decltype(tag);
    DecodeArgs<T> p{};
    p.out = out.ptr<T>(), p.q = q.ptr<T>(), p.k = k.ptr<T>(), p.v = v.ptr<T>();
    p.lens = static_cast<const int32_t*>(seq_lens.data);
    p.out_rs = row_stride_of(out), p.q_rs = row_stride_of(q), p.k_rs = row_stride_of(k), p.v_rs = row_stride_of(v);
    p.batch = batch, p.hq = hq, p.hkv = hkv, p.d = d, p.max_ctx = max_ctx;
    p.splits = int(splits), p.slots = int(splits) * kWarps;
    p.scale = float(attention_scale(softmax_scale, d));
    const int64_t bytes = batch * hq * p.slots * (d + 2) * int64_t(sizeof(float));
    p.partial = static_cast<float*>(cuda_workspace(ctx, bytes));
    const int64_t group = hq / hkv;
    if (group == 1) launch_partial<T, 1>(ctx, p);
    else if (group == 2) launch_partial<T, 2>(ctx, p);
    else if (group <= 4) launch_partial<T, 4>(ctx, p);
    else launch_partial<T, 8>(ctx, p);
    check_launch("attention_decode partial kernel launch");
    const int threads = int(std::min<int64_t>(256, (d + 31) / 32 * 32));
    decode_combine_kernel<T><<<dim3(unsigned(hq), unsigned(batch)), threads, 0, stream_of(ctx)>>>(p);
    check_launch("attention_decode combine kernel launch");
  });
}

}  // namespace
}  // namespace cuda::attention

void attention_decode_cuda(const Context& ctx, const TensorView& out, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& seq_lens, double softmax_scale) {
  cuda::attention::run(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
}
const char* attention_decode_cuda_applicable(const TensorView& out, const TensorView& q,
                                             const TensorView& k_cache, const TensorView&,
                                             const TensorView&, double) {
  if (!cuda::is_cuda_float(q.dtype)) return cuda::kNotCudaFloat;
  if (q.size(2) > 32 * cuda::attention::kMaxPerLane) return "head_dim > 256";
  if (k_cache.size(2) > 0 && q.size(1) / k_cache.size(2) > cuda::attention::kMaxGroup)
    return "more than 8 query heads per kv head";
  if (q.size(0) > 65535 || k_cache.size(2) > 65535) return "more than 65535 sequences or kv heads";
  (void)out;
  return nullptr;
}

void register_attention_cuda(Registry& reg) {
  KernelDesc d = cuda_kernel_desc(
      "cuda", 100,
      "split-K decoding: per-warp online softmax over key chunks, GQA heads share K/V reads, "
      "f32 partials combined in fixed order",
      false);
  d.properties.batch_invariant = false;  // the split count depends on the batch size
  reg.add_kernel<AttentionDecode>(d, &attention_decode_cuda, &attention_decode_cuda_applicable);
  register_attention_decode_split_cuda(reg);  // cuda_decode.cu: impl cuda_split, preferred
  register_attention_prefill_cuda(reg);
  register_attention_prefill_backward_cuda(reg);
  register_attention_prefill_cudnn(reg);
}

}  // namespace opforge
