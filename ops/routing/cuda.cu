// CUDA kernels of topk_softmax and grouped_topk (MoE routing), up to 256 experts and topk <= 32.
//
// Math (the op's doc): p = softmax(logits) over the E experts of a token, in f32 (accurate expf,
// no fast-math); the topk experts of highest logit are picked in descending order, equal logits
// picking the lower id (Note [routing ties]; ranking logits ranks p exactly); topk_weights are
// their p (f32), divided by their f32 sum when renormalize; topk_ids their ids (i32).
//
// Technique. One warp per token, no shared memory, no barriers, one launch for the whole batch:
//  - Lane l holds experts [l * V, l * V + V) in registers, V = E / 32 rounded up to 1, 2, 4 or 8
//    (128 experts: 4 per lane). The softmax sum is an xor butterfly (Note [cuda reductions]) and
//    the max a redux.sync, so every lane holds the same bits.
//  - Order keys: a logit's f32 bits map to an unsigned key whose integer order is the float order
//    (sign flipped for positives, all bits for negatives), so a warp max is one redux.sync
//    (__reduce_max_sync) instead of a 5-step butterfly.
//  - topk rounds of a warp argmax, two redux.sync each: the max key over every lane's best expert
//    not yet taken, then the min id among the lanes holding that key (Note [routing ties]). Every
//    lane gets the same winner, and the lane holding it zeroes its key (taken). Keys are computed
//    once per token, so a round is about 20 instructions. Lane r keeps round r's key and id; after
//    the rounds every lane computes its weight exp(logit - max) / sum from the decoded key at once
//    (the same f32 math as the softmax), and lanes < topk store their results (coalesced).
//  - bf16 / f16 logits: the 16-bit order key and the complemented id share one 32-bit word
//    (Note [packed routing keys]), so a round is a single redux.sync (max) and no id search.
//  - cuda_vec (priority 200): a lane's V experts come in with one vector load of V * itemsize bytes
//    (16 bytes for f32 with V = 4, split in 16-byte loads above that); the predicate requires
//    E = 32 V and the row base and stride aligned to that width. cuda (priority 100): scalar loads
//    with the lanes past E padded (never picked), any row stride.
//  - Launch: 256 threads (8 tokens) a block; the grid is min(blocks needed, 4 x the blocks resident
//    on all SMs (cuda_device_props)) and warps stride over tokens. 64-bit offsets. One launch on
//    ctx.stream, no host synchronization, no allocation, programmatic (Note [programmatic launch]
//    in cuda_launch.cuh).
// grouped_topk (cuda, priority 100) uses the same layout, keys and launch; see its kernel below.
#include <algorithm>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/routing/internal.h"
#include "ops/routing/routing_cuda.h"

namespace opforge {
namespace cuda::routing {
namespace {

template <class T> struct Args {
  const T* logits;
  int64_t logits_stride;
  int64_t tokens;
  int experts, topk;
  bool renormalize;
  float* weights;
  int64_t weights_stride;
  int32_t* ids;
  int64_t ids_stride;
};

// Raw word of 2, 4, 8 or 16 bytes (one LDG of that width).
template <int bytes> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// V contiguous elements with loads of min(16, V * sizeof(T)) bytes; p aligned to that width.
template <class T, int V> __device__ __forceinline__ void load_lane(const T* p, float* out) {
  constexpr int bytes = V * int(sizeof(T));
  constexpr int chunk = bytes < 16 ? bytes : 16;
  constexpr int per_chunk = chunk / int(sizeof(T));
  using W = typename Word<chunk>::type;
#pragma unroll
  for (int c = 0; c < V / per_chunk; ++c) {
    const W raw = reinterpret_cast<const W*>(p)[c];
    T v[per_chunk];
    static_assert(sizeof(v) == sizeof(raw));
    __builtin_memcpy(v, &raw, sizeof(raw));
#pragma unroll
    for (int j = 0; j < per_chunk; ++j) out[c * per_chunk + j] = to_f32(v[j]);
  }
}

// Unsigned keys in the order of the floats (NaNs above +inf); 0 is below every float's key.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// 16-bit element bits and their order key (same mapping as order_key, on 16 bits).
template <class T> __device__ __forceinline__ unsigned bits16(T v) {
  unsigned short b;
  static_assert(sizeof(T) == 2);
  __builtin_memcpy(&b, &v, 2);
  return b;
}
template <class T> __device__ __forceinline__ T from_bits16(unsigned b) {
  const unsigned short s = static_cast<unsigned short>(b);
  T v;
  __builtin_memcpy(&v, &s, 2);
  return v;
}
__device__ __forceinline__ unsigned order_key16(unsigned b) { return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u); }
__device__ __forceinline__ unsigned key16_bits(unsigned k) { return (k & 0x8000u) ? (k & 0x7fffu) : (~k & 0xffffu); }

template <class T, int V, bool kVec>
__global__ void __launch_bounds__(256) topk_softmax_kernel(Args<T> a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const int first = lane * V;
  programmatic_prologue();  // Note [programmatic launch]
  for (int64_t t = warp; t < a.tokens; t += n_warps) {  // uniform over the warp
    const T* row = a.logits + t * a.logits_stride;
    float v[V];
    unsigned taken = 0;
    if constexpr (kVec) {
      load_lane<T, V>(row + first, v);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const bool in = first + j < a.experts;
        v[j] = in ? to_f32(row[first + j]) : -INFINITY;
        if (!in) taken |= 1u << j;
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < V; ++j) m = fmaxf(m, v[j]);
    m = key_value(__reduce_max_sync(0xffffffffu, order_key(m)));
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) sum += (taken >> j & 1u) ? 0.0f : expf(v[j] - m);
    sum = group_sum<32>(sum);

    unsigned my_key = 0;
    int my_id = 0;
    if constexpr (sizeof(T) == 2) {
      // Note [packed routing keys]: a 16-bit logit's order key and the complement of its id fit
      // one 32-bit word, unique per expert, whose integer order is (logit, then lower id): a round
      // is one redux.sync, and the lane holding the winner is the one whose key equals it.
      unsigned key[V];
#pragma unroll
      for (int j = 0; j < V; ++j)
        key[j] = (taken >> j & 1u) ? 0u : (order_key16(bits16(from_f32<T>(v[j]))) << 16) | (0xffffu - unsigned(first + j));
      for (int r = 0; r < a.topk; ++r) {
        unsigned best = key[0];
#pragma unroll
        for (int j = 1; j < V; ++j) best = max(best, key[j]);
        const unsigned top = __reduce_max_sync(0xffffffffu, best);
#pragma unroll
        for (int j = 0; j < V; ++j) key[j] = key[j] == top ? 0u : key[j];
        if (lane == r) my_key = top;
      }
      my_id = int(0xffffu - (my_key & 0xffffu));
      const float logit = to_f32(from_bits16<T>(key16_bits(my_key >> 16)));
      my_key = order_key(logit);  // the f32 key the weight below decodes
    } else {
      // Keys computed once; a taken (or padded) expert's key becomes 0, below every real key.
      unsigned key[V];
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = (taken >> j & 1u) ? 0u : order_key(v[j]);
      for (int r = 0; r < a.topk; ++r) {
        unsigned best = key[0];
#pragma unroll
        for (int j = 1; j < V; ++j) best = max(best, key[j]);
        const unsigned top = __reduce_max_sync(0xffffffffu, best);
        unsigned cand = 0xffffffffu;  // this lane's lowest id holding the top key
#pragma unroll
        for (int j = V - 1; j >= 0; --j) cand = key[j] == top ? unsigned(first + j) : cand;
        const unsigned id = __reduce_min_sync(0xffffffffu, cand);
#pragma unroll
        for (int j = 0; j < V; ++j) key[j] = unsigned(first + j) == id ? 0u : key[j];
        if (lane == r) my_key = top, my_id = int(id);
      }
    }
    // Lane r's weight from its round's key: the same f32 math as the softmax above.
    float my_w = expf(key_value(my_key) - m) / sum;
    if (a.renormalize) {
      const float total = group_sum<32>(lane < a.topk ? my_w : 0.0f);
      my_w = my_w / total;
    }
    if (lane < a.topk) {
      a.weights[t * a.weights_stride + lane] = my_w;
      a.ids[t * a.ids_stride + lane] = my_id;
    }
  }
}

// ---- grouped_topk -----------------------------------------------------------------------------
template <class T> struct GroupedArgs {
  Args<T> base;
  int groups, topk_group;
  bool sigmoid;
  const void* bias;  // nullptr: none
  bool bias_f32;     // else of T
  int64_t bias_stride;
  float scaling;
};

// Same lane layout and order keys as topk_softmax. Scores s (softmax or sigmoid, f32); keys rank
// the logits, or s + bias with a bias. Group g's key is the max key of its experts, or with a bias
// the order key of the f32 sum of its two largest s + bias (the largest twice when it occurs
// twice); one redux.sync each, looped over the groups. Lane g keeps group g's key; topk_group
// rounds of (redux max, redux min lane) keep the best groups, and each expert learns its group's
// verdict by one shuffle. The topk rounds then run on the kept experts' keys; a picked expert's
// s comes from its owner lane by V shuffles after the rounds.
template <class T, int V>
__global__ void __launch_bounds__(256) grouped_topk_kernel(GroupedArgs<T> g) {
  const Args<T>& a = g.base;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const int first = lane * V;
  const int group_size = a.experts / g.groups;
  programmatic_prologue();  // Note [programmatic launch]
  for (int64_t t = warp; t < a.tokens; t += n_warps) {  // uniform over the warp
    const T* row = a.logits + t * a.logits_stride;
    float v[V], s[V];
    unsigned key[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = first + j < a.experts ? to_f32(row[first + j]) : -INFINITY;
    if (g.sigmoid) {
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] = first + j < a.experts ? 1.0f / (1.0f + expf(-v[j])) : 0.0f;
    } else {
      float m = -INFINITY;
#pragma unroll
      for (int j = 0; j < V; ++j) m = fmaxf(m, v[j]);
      m = key_value(__reduce_max_sync(0xffffffffu, order_key(m)));
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        s[j] = first + j < a.experts ? expf(v[j] - m) : 0.0f;
        sum += s[j];
      }
      sum = group_sum<32>(sum);
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] = s[j] / sum;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int e = first + j;
      float k = v[j];
      if (g.bias && e < a.experts) {
        const int64_t at = int64_t(e) * g.bias_stride;
        k = s[j] + (g.bias_f32 ? static_cast<const float*>(g.bias)[at]
                               : to_f32(static_cast<const T*>(g.bias)[at]));
      }
      key[j] = e < a.experts ? order_key(k) : 0u;
    }

    // Group keys: lane gi holds group gi's.
    unsigned group_key = 0;
    for (int gi = 0; gi < g.groups; ++gi) {
      unsigned best = 0;
#pragma unroll
      for (int j = 0; j < V; ++j)
        if ((first + j) / group_size == gi) best = max(best, key[j]);
      const unsigned top = __reduce_max_sync(0xffffffffu, best);
      unsigned gk = top;
      if (g.bias) {
        unsigned count = 0, below = 0;
#pragma unroll
        for (int j = 0; j < V; ++j)
          if ((first + j) / group_size == gi && key[j] != 0u) {
            count += key[j] == top;
            if (key[j] != top) below = max(below, key[j]);
          }
        count = __reduce_add_sync(0xffffffffu, count);
        const unsigned second = count >= 2 ? top : __reduce_max_sync(0xffffffffu, below);
        gk = order_key(key_value(top) + key_value(second));
      }
      if (lane == gi) group_key = gk;
    }
    bool kept = false;
    for (int r = 0; r < g.topk_group; ++r) {
      const unsigned top = __reduce_max_sync(0xffffffffu, group_key);
      const unsigned gi = __reduce_min_sync(0xffffffffu, group_key == top && lane < g.groups
                                                             ? unsigned(lane) : 0xffffffffu);
      if (unsigned(lane) == gi) kept = true, group_key = 0;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int e = first + j;
      const int gi = e < a.experts ? e / group_size : 0;
      const bool keep = __shfl_sync(0xffffffffu, kept, gi);
      if (!keep || e >= a.experts) key[j] = 0u;
    }

    int my_id = 0;
    for (int r = 0; r < a.topk; ++r) {
      unsigned best = key[0];
#pragma unroll
      for (int j = 1; j < V; ++j) best = max(best, key[j]);
      const unsigned top = __reduce_max_sync(0xffffffffu, best);
      unsigned cand = 0xffffffffu;
#pragma unroll
      for (int j = V - 1; j >= 0; --j) cand = key[j] == top ? unsigned(first + j) : cand;
      const unsigned id = __reduce_min_sync(0xffffffffu, cand);
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = unsigned(first + j) == id ? 0u : key[j];
      if (lane == r) my_id = int(id);
    }
    float my_w = 0.0f;
    const int owner = lane < a.topk ? my_id / V : 0, slot = my_id - owner * V;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float sj = __shfl_sync(0xffffffffu, s[j], owner);
      if (j == slot) my_w = sj;
    }
    if (a.renormalize) {
      const float total = group_sum<32>(lane < a.topk ? my_w : 0.0f);
      my_w = my_w / total;
    }
    if (lane < a.topk) {
      a.weights[t * a.weights_stride + lane] = my_w * g.scaling;
      a.ids[t * a.ids_stride + lane] = my_id;
    }
  }
}

int lanes_width(int64_t experts) {  // V: experts per lane
  return experts <= 32 ? 1 : experts <= 64 ? 2 : experts <= 128 ? 4 : 8;
}

template <class T, int V, bool kVec> void launch(const Context& ctx, const Args<T>& a) {
  constexpr int threads = 256, tokens_per_block = threads / 32;
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  const int64_t resident = int64_t(props.sm_count) * std::max(1, props.max_threads_per_sm / threads);
  const int64_t needed = (a.tokens + tokens_per_block - 1) / tokens_per_block;
  const int64_t grid = std::max<int64_t>(1, std::min(needed, 4 * resident));
  launch_programmatic(ctx, "topk_softmax kernel launch", topk_softmax_kernel<T, V, kVec>, dim3(unsigned(grid)),
                      dim3(threads), 0, a);
}

template <bool kVec>
void run(const Context& ctx, const TensorView& w, const TensorView& ids, const TensorView& logits,
         int64_t topk, bool renormalize) {
  const RoutingPlan plan = topk_softmax_plan(w, ids, logits, topk, renormalize);
  if (plan.tokens == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(logits.dtype, "topk_softmax", [&](auto tag) {
    using T = decltype(tag);
    Args<T> a{};
    a.logits = static_cast<const T*>(plan.logits);
    a.logits_stride = plan.logits_stride;
    a.tokens = plan.tokens;
    a.experts = int(plan.experts);
    a.topk = int(plan.topk);
    a.renormalize = plan.renormalize;
    a.weights = plan.weights, a.weights_stride = plan.weights_stride;
    a.ids = plan.ids, a.ids_stride = plan.ids_stride;
    switch (lanes_width(plan.experts)) {
      case 1: launch<T, 1, kVec>(ctx, a); break;
      case 2: launch<T, 2, kVec>(ctx, a); break;
      case 4: launch<T, 4, kVec>(ctx, a); break;
      default: launch<T, 8, kVec>(ctx, a); break;
    }
  });
}

template <class T, int V> void launch_grouped(const Context& ctx, const GroupedArgs<T>& g) {
  constexpr int threads = 256, tokens_per_block = threads / 32;
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  const int64_t resident = int64_t(props.sm_count) * std::max(1, props.max_threads_per_sm / threads);
  const int64_t needed = (g.base.tokens + tokens_per_block - 1) / tokens_per_block;
  const int64_t grid = std::max<int64_t>(1, std::min(needed, 4 * resident));
  launch_programmatic(ctx, "grouped_topk kernel launch", grouped_topk_kernel<T, V>, dim3(unsigned(grid)),
                      dim3(threads), 0, g);
}

void run_grouped(const Context& ctx, const TensorView& w, const TensorView& ids,
                 const TensorView& logits, const TensorView& bias, int64_t topk, bool renormalize,
                 int64_t groups, int64_t topk_group, std::string_view scoring, double scaling) {
  const RoutingPlan plan = grouped_topk_plan(w, ids, logits, bias, topk, renormalize, groups,
                                             topk_group, scoring, scaling);
  if (plan.tokens == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(logits.dtype, "grouped_topk", [&](auto tag) {
    using T = decltype(tag);
    GroupedArgs<T> g{};
    Args<T>& a = g.base;
    a.logits = static_cast<const T*>(plan.logits);
    a.logits_stride = plan.logits_stride;
    a.tokens = plan.tokens;
    a.experts = int(plan.experts);
    a.topk = int(plan.topk);
    a.renormalize = plan.renormalize;
    a.weights = plan.weights, a.weights_stride = plan.weights_stride;
    a.ids = plan.ids, a.ids_stride = plan.ids_stride;
    g.groups = int(plan.groups);
    g.topk_group = int(plan.topk_group);
    g.sigmoid = plan.sigmoid;
    g.bias = plan.bias;
    g.bias_f32 = plan.bias_dtype == DType::f32;
    g.bias_stride = plan.bias_stride;
    g.scaling = float(plan.scaling);
    switch (lanes_width(plan.experts)) {
      case 1: launch_grouped<T, 1>(ctx, g); break;
      case 2: launch_grouped<T, 2>(ctx, g); break;
      case 4: launch_grouped<T, 4>(ctx, g); break;
      default: launch_grouped<T, 8>(ctx, g); break;
    }
  });
}

const char* common_problem(const TensorView& logits, int64_t topk) {
  if (!is_cuda_float(logits.dtype)) return kNotCudaFloat;
  if (logits.size(-1) > 256) return "more than 256 experts";
  if (topk > 32) return "topk > 32";
  return nullptr;
}

}  // namespace
}  // namespace cuda::routing

void topk_softmax_cuda(const Context& ctx, const TensorView& w, const TensorView& ids,
                       const TensorView& logits, int64_t topk, bool renormalize) {
  cuda::routing::run<false>(ctx, w, ids, logits, topk, renormalize);
}
const char* topk_softmax_cuda_applicable(const TensorView&, const TensorView&,
                                         const TensorView& logits, int64_t topk, bool) {
  return cuda::routing::common_problem(logits, topk);
}
void topk_softmax_cuda_vec(const Context& ctx, const TensorView& w, const TensorView& ids,
                           const TensorView& logits, int64_t topk, bool renormalize) {
  cuda::routing::run<true>(ctx, w, ids, logits, topk, renormalize);
}
const char* topk_softmax_cuda_vec_applicable(const TensorView&, const TensorView&,
                                             const TensorView& logits, int64_t topk, bool) {
  if (const char* why = cuda::routing::common_problem(logits, topk)) return why;
  const int64_t experts = logits.size(-1);
  const int v = cuda::routing::lanes_width(experts);
  if (experts != 32 * v) return "experts is not 32, 64, 128 or 256";
  const int64_t width = std::min<int64_t>(16, v * logits.itemsize());
  if (reinterpret_cast<uintptr_t>(logits.data) % uintptr_t(width) != 0)
    return "gating_output is not aligned to a lane's vector load";
  if (logits.size(0) > 1 && (logits.stride(0) * logits.itemsize()) % width != 0)
    return "the gating_output row stride is not a multiple of a lane's vector load";
  return nullptr;
}

void grouped_topk_cuda(const Context& ctx, const TensorView& w, const TensorView& ids,
                       const TensorView& logits, const TensorView& bias, int64_t topk,
                       bool renormalize, int64_t num_expert_group, int64_t topk_group,
                       std::string_view scoring_func, double routed_scaling_factor) {
  cuda::routing::run_grouped(ctx, w, ids, logits, bias, topk, renormalize, num_expert_group,
                             topk_group, scoring_func, routed_scaling_factor);
}
const char* grouped_topk_cuda_applicable(const TensorView&, const TensorView&,
                                         const TensorView& logits, const TensorView& bias,
                                         int64_t topk, bool, int64_t num_expert_group, int64_t,
                                         std::string_view, double) {
  if (const char* why = cuda::routing::common_problem(logits, topk)) return why;
  if (num_expert_group > 32) return "more than 32 expert groups";
  if (bias.defined() && bias.dtype != DType::f32 && bias.dtype != logits.dtype)
    return "e_score_correction_bias is neither f32 nor of gating_output's dtype";
  return nullptr;
}

void register_routing_cuda(Registry& reg) {
  const char* vec = "one warp per token, a lane's experts in one vector load, shuffle top-k, f32";
  const char* scalar = "one warp per token, scalar loads (any row stride, E <= 256), shuffle top-k";
  reg.add_kernel<TopkSoftmax>(cuda_kernel_desc("cuda_vec", 200, vec, false),
                              &topk_softmax_cuda_vec, &topk_softmax_cuda_vec_applicable);
  reg.add_kernel<TopkSoftmax>(cuda_kernel_desc("cuda", 100, scalar, false), &topk_softmax_cuda,
                              &topk_softmax_cuda_applicable);
  reg.add_kernel<GroupedTopk>(
      cuda_kernel_desc("cuda", 100, "one warp per token, redux.sync group and expert rounds, f32",
                       false),
      &grouped_topk_cuda, &grouped_topk_cuda_applicable);
  register_moe_cuda(reg);
}

}  // namespace opforge
