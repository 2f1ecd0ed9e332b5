// CUDA kernels of rotary_embedding and rotary_embedding_backward (in place, vLLM's form).
//
// Math (Note [rotary pairs]): for token t, c = cache[positions[t], :r/2], s = sign *
// cache[positions[t], r/2:] (sign = -1 for the backward op); every head of query and key has its
// pairs (x1, x2) replaced by (x1 c - x2 s, x2 c + x1 s). NeoX pairs dim i with i + r/2, GPT-J dims
// 2i and 2i + 1. Dims past rotary_dim are neither read nor written. Math in f32 (accurate, no
// fast-math), one rounding per output.
//
// Technique. Memory-bound: every rotated element is read once and written once.
//  - Block shape: threadIdx.x walks the "units" of the rotary part of one head (a unit is a
//    16-byte pack of pairs in cuda_vec16, one pair in cuda), threadIdx.y walks the heads of query
//    and key together (GQA: any n_q, n_kv). A thread loads the cos / sin of its unit once per
//    token into registers (one LDG.128 each for NeoX packs) and rotates that slice in every head
//    it owns, so the cache row is read from memory once per token. heads per thread =
//    ceil(heads / (256 / units)), blockDim.y = ceil(heads / heads per thread): no idle rows.
//  - cuda_vec16 (priority 200): NeoX loads x1 and x2 as two 16-byte packs (8 bf16/f16 or 4 f32
//    pairs); GPT-J loads one pack of interleaved pairs. The predicate requires 16-byte aligned
//    bases, head_size, token strides and the cache row stride multiples of the pack, and r/2 a
//    multiple of the pairs of a pack; it names what fails. cuda (priority 100) is the same walk
//    over single pairs for any layout the check accepts (odd sizes, padded rows).
//  - Note [rotary heads in flight]: the rotation is in place, so the compiler cannot hoist a later
//    head's loads above an earlier head's stores; the cuda_vec16 kernel takes its heads two at a
//    time and loads both heads' packs before it rotates and stores either (about 70 registers at
//    bf16 instead of 46). H200, bf16, 32 + 8 heads x 128, against the one-head loop in one call,
//    twice: 1,024 tokens 5.30 -> 5.07 us (96% -> 101% of copy), 16,384 tokens 89.9 -> 88.6
//    (docs/perf/gpu-h200-2026-12-02-round40.md).
//  - Launch: blockIdx.x strides over tokens; the grid is min(tokens, 4 x the blocks resident on
//    all SMs (cuda_device_props)). 64-bit offsets throughout. One launch on ctx.stream, no host
//    synchronization, no allocation, programmatic (Note [programmatic launch] in cuda_launch.cuh).
//  - Positions are device data, so the op's check cannot read them: a token whose position lies
//    outside [0, max_position) is left unchanged rather than read out of bounds.
#include <algorithm>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/rotary/rotary_cuda.h"

namespace opforge {
namespace cuda::rotary {
namespace {

template <class T> struct Args {
  T* q;
  T* k;
  const int64_t* pos;
  const T* cache;
  int64_t q_stride, k_stride, pos_stride, cache_stride, max_pos;
  int64_t tokens, n_q, heads, head_size, half, units;
  float sin_sign;
};

// Pairs rotated by one unit.
template <class T, bool kVec, bool kNeox> __host__ __device__ constexpr int pairs_per_unit() {
  return kVec ? (kNeox ? Pack<T>::n : Pack<T>::n / 2) : 1;
}

template <class T, bool kVec, bool kNeox>
__global__ void __launch_bounds__(256) rotary_kernel(Args<T> p) {
  constexpr int P = pairs_per_unit<T, kVec, kNeox>();
  programmatic_prologue();  // Note [programmatic launch]
  for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int64_t pos = p.pos[t * p.pos_stride];
    if (pos < 0 || pos >= p.max_pos) continue;  // uniform over the block; no barriers below
    const T* cos_row = p.cache + pos * p.cache_stride;
    const T* sin_row = cos_row + p.half;
    T* q_row = p.q + t * p.q_stride;
    T* k_row = p.k + t * p.k_stride;
    for (int64_t u = threadIdx.x; u < p.units; u += blockDim.x) {
      const int64_t i0 = u * P;  // first pair of the unit
      float c[P], s[P];
      if constexpr (kVec && kNeox) {
        const Pack<T> cp = load_pack_readonly(cos_row + i0), sp = load_pack_readonly(sin_row + i0);
#pragma unroll
        for (int j = 0; j < P; ++j) c[j] = to_f32(cp.v[j]), s[j] = p.sin_sign * to_f32(sp.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < P; ++j)
          c[j] = to_f32(cos_row[i0 + j]), s[j] = p.sin_sign * to_f32(sin_row[i0 + j]);
      }
      if constexpr (kVec) {  // Note [rotary heads in flight]: two heads' packs, then their stores
        for (int64_t h0 = threadIdx.y; h0 < p.heads; h0 += 2 * blockDim.y) {
          const int64_t hs[2] = {h0, h0 + blockDim.y};
          const bool has[2] = {true, h0 + blockDim.y < p.heads};
          T* base[2];
          Pack<T> a[2], b[2];
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if (!has[k]) continue;
            const int64_t h = hs[k];
            T* row = h < p.n_q ? q_row + h * p.head_size : k_row + (h - p.n_q) * p.head_size;
            base[k] = kNeox ? row + i0 : row + 2 * i0;
            a[k] = load_pack(base[k]);
            if constexpr (kNeox) b[k] = load_pack(base[k] + p.half);
          }
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if (!has[k]) continue;
            if constexpr (kNeox) {
              Pack<T> o1, o2;
#pragma unroll
              for (int j = 0; j < P; ++j) {
                const float fa = to_f32(a[k].v[j]), fb = to_f32(b[k].v[j]);
                o1.v[j] = from_f32<T>(fa * c[j] - fb * s[j]);
                o2.v[j] = from_f32<T>(fb * c[j] + fa * s[j]);
              }
              store_pack(base[k], o1);
              store_pack(base[k] + p.half, o2);
            } else {
              Pack<T> o;
#pragma unroll
              for (int j = 0; j < P; ++j) {
                const float fa = to_f32(a[k].v[2 * j]), fb = to_f32(a[k].v[2 * j + 1]);
                o.v[2 * j] = from_f32<T>(fa * c[j] - fb * s[j]);
                o.v[2 * j + 1] = from_f32<T>(fb * c[j] + fa * s[j]);
              }
              store_pack(base[k], o);
            }
          }
        }
        continue;
      }
      for (int64_t h = threadIdx.y; h < p.heads; h += blockDim.y) {  // one pair at a time
        T* row = h < p.n_q ? q_row + h * p.head_size : k_row + (h - p.n_q) * p.head_size;
        T* x1 = kNeox ? row + i0 : row + 2 * i0;  // NeoX: dims i0 and i0 + r/2; GPT-J: 2 i0, 2 i0 + 1
        T* x2 = kNeox ? x1 + p.half : x1 + 1;
        const float fa = to_f32(*x1), fb = to_f32(*x2);
        *x1 = from_f32<T>(fa * c[0] - fb * s[0]);
        *x2 = from_f32<T>(fb * c[0] + fa * s[0]);
      }
    }
  }
}

template <class T, bool kVec, bool kNeox> void launch(const Context& ctx, Args<T> p) {
  p.units = p.half / pairs_per_unit<T, kVec, kNeox>();
  const int bx = int(std::min<int64_t>(p.units, 256));
  const int64_t max_by = std::max(1, 256 / bx);
  const int64_t per_thread = (p.heads + max_by - 1) / max_by;
  const int by = int((p.heads + per_thread - 1) / per_thread);
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  const int64_t resident =
      int64_t(props.sm_count) * std::max(1, props.max_threads_per_sm / (bx * by));
  const int64_t grid = std::max<int64_t>(1, std::min(p.tokens, 4 * resident));
  launch_programmatic(ctx, "rotary_embedding kernel launch", rotary_kernel<T, kVec, kNeox>, dim3(unsigned(grid)),
                      dim3(bx, by), 0, p);
}

template <bool kVec>
void run(const Context& ctx, const TensorView& positions, const TensorView& query,
         const TensorView& key, const TensorView& cache, int64_t head_size, bool is_neox,
         float sin_sign) {
  const int64_t tokens = positions.size(0);
  const int64_t heads = (query.size(1) + key.size(1)) / head_size;
  if (tokens == 0 || heads == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(query.dtype, "rotary_embedding", [&](auto tag) {
    using T = decltype(tag);
    Args<T> p{};
    p.q = query.ptr<T>(), p.k = key.ptr<T>();
    p.pos = static_cast<const int64_t*>(positions.data);
    p.cache = cache.ptr<T>();
    p.q_stride = query.stride(0), p.k_stride = key.stride(0), p.pos_stride = positions.stride(0);
    p.cache_stride = cache.stride(0), p.max_pos = cache.size(0);
    p.tokens = tokens, p.n_q = query.size(1) / head_size, p.heads = heads;
    p.head_size = head_size, p.half = cache.size(1) / 2;
    p.sin_sign = sin_sign;
    if (is_neox) launch<T, kVec, true>(ctx, p);
    else launch<T, kVec, false>(ctx, p);
  });
}

}  // namespace
}  // namespace cuda::rotary

using cuda::rotary::run;

void rotary_embedding_cuda(const Context& ctx, const TensorView& positions, const TensorView& query,
                           const TensorView& key, const TensorView& cache, int64_t head_size,
                           bool is_neox) {
  run<false>(ctx, positions, query, key, cache, head_size, is_neox, 1.0f);
}
void rotary_embedding_cuda_vec16(const Context& ctx, const TensorView& positions,
                                 const TensorView& query, const TensorView& key,
                                 const TensorView& cache, int64_t head_size, bool is_neox) {
  run<true>(ctx, positions, query, key, cache, head_size, is_neox, 1.0f);
}
void rotary_embedding_backward_cuda(const Context& ctx, const TensorView& positions,
                                    const TensorView& dquery, const TensorView& dkey,
                                    const TensorView& cache, int64_t head_size, bool is_neox) {
  run<false>(ctx, positions, dquery, dkey, cache, head_size, is_neox, -1.0f);
}
void rotary_embedding_backward_cuda_vec16(const Context& ctx, const TensorView& positions,
                                          const TensorView& dquery, const TensorView& dkey,
                                          const TensorView& cache, int64_t head_size,
                                          bool is_neox) {
  run<true>(ctx, positions, dquery, dkey, cache, head_size, is_neox, -1.0f);
}

const char* rotary_embedding_cuda_applicable(const TensorView&, const TensorView& query,
                                             const TensorView&, const TensorView&, int64_t, bool) {
  return cuda::is_cuda_float(query.dtype) ? nullptr : cuda::kNotCudaFloat;
}

const char* rotary_embedding_cuda_vec16_applicable(const TensorView& positions,
                                                   const TensorView& query, const TensorView& key,
                                                   const TensorView& cache, int64_t head_size,
                                                   bool is_neox) {
  if (!cuda::is_cuda_float(query.dtype)) return cuda::kNotCudaFloat;
  const int64_t n = 16 / query.itemsize();
  const int64_t half = cache.size(1) / 2;
  if (head_size % n != 0) return n == 8 ? "head_size % 8 != 0" : "head_size % 4 != 0";
  if (is_neox && half % n != 0) return n == 8 ? "rotary_dim / 2 % 8 != 0" : "rotary_dim / 2 % 4 != 0";
  if (!is_neox && half % (n / 2) != 0)
    return n == 8 ? "rotary_dim / 2 % 4 != 0" : "rotary_dim / 2 % 2 != 0";
  if (!cuda::aligned16(query.data) || !cuda::aligned16(key.data))
    return "query or key data is not 16-byte aligned";
  const int64_t tokens = positions.size(0);
  if (tokens > 1 && (query.stride(0) % n != 0 || key.stride(0) % n != 0))
    return "a token stride of query or key is not a multiple of 16 bytes";
  if (is_neox) {
    if (!cuda::aligned16(cache.data)) return "cos_sin_cache data is not 16-byte aligned";
    if (cache.size(0) > 1 && cache.stride(0) % n != 0)
      return "the cos_sin_cache row stride is not a multiple of 16 bytes";
  }
  return nullptr;
}

void register_rotary_cuda(Registry& reg) {
  const char* vec = "16-byte packs of a head row, cos / sin in registers once per token, f32 math";
  const char* scalar = "any layout: one pair per thread-step, cos / sin once per token, f32 math";
  reg.add_kernel<RotaryEmbedding>(cuda_kernel_desc("cuda_vec16", 200, vec, false),
                                  &rotary_embedding_cuda_vec16,
                                  &rotary_embedding_cuda_vec16_applicable);
  reg.add_kernel<RotaryEmbedding>(cuda_kernel_desc("cuda", 100, scalar, false),
                                  &rotary_embedding_cuda, &rotary_embedding_cuda_applicable);
  reg.add_kernel<RotaryEmbeddingBackward>(cuda_kernel_desc("cuda_vec16", 200, vec, false),
                                          &rotary_embedding_backward_cuda_vec16,
                                          &rotary_embedding_cuda_vec16_applicable);
  reg.add_kernel<RotaryEmbeddingBackward>(cuda_kernel_desc("cuda", 100, scalar, false),
                                          &rotary_embedding_backward_cuda,
                                          &rotary_embedding_cuda_applicable);
}

}  // namespace opforge
