// CUDA kernels `cuda_split_async` and `cuda_split` of attention_decode: split-KV ("flash
// decoding") for f16 / bf16 caches, built to stream the K and V rows at the memory-bandwidth
// limit. The element-wise kernel of cuda.cu (impl `cuda`) stays registered below them for
// whatever their predicate rejects (f32, head_dim % 8 != 0, misaligned rows, ...).
//
// Math (the op's doc): out[b, h] = sum_{j < len_b} softmax_j(scale * q[b, h] . k[b, j, g])
// v[b, j, g], g = h / (Hq / Hkv); a sequence of length 0 gives 0. seq_lens stays on the device
// (never copied to the host) and is clamped there to [0, max_ctx]; no cache row at or past len_b
// is read.
//
// Assumptions (attention_decode_cuda_split_applicable names the one that fails): f16 or bf16;
// head_dim a multiple of 8 in [8, 256]; q, k_cache and v_cache 16-byte aligned with row strides a
// multiple of 8 elements (out is written element-wise, any row stride); Hq / Hkv <= 8;
// batch * Hkv <= 2^20 (grid size); seq_lens int32.
//
// Launch shape.
//  1. Partial pass, 128 threads (4 warps) per block, one block per (split, kv head, sequence),
//     flattened on grid x. Split s covers keys [s * chunk, min((s + 1) * chunk, len_b)); chunk is
//     a multiple of the block's key tile, at least 256 keys, chosen on the host from the SM count,
//     batch, Hkv and max_ctx so that about 16 blocks per SM are launched (4 resident, about 4
//     waves), batch 1 included. A split at or past len_b writes (m = -inf, l = 0) and exits.
//     A key row is read by L = 8, 16 or 32 lanes (head_dim <= 64, 128, 256), one 16-byte pack
//     (8 elements) a lane, so one warp step reads 32 / L keys, and a tile is 4 warps x 32 / L keys
//     x `steps`. For each tile a lane group computes the scores of its keys for every query head
//     of the group (q in registers, pre-scaled by scale * log2 e; one L-lane shuffle reduction per
//     head and key), then one online-softmax update per head (running max m, sum l, accumulator,
//     all f32, exponentials in base 2) and the weighted V rows. At the end the lane groups of a
//     warp merge by shuffles, the 4 warps through shared memory, and the block writes one
//     unnormalized (o[D], m, l) per query head to the workspace: o [B, Hq, splits, D] and
//     ml [B, Hq, splits, 2], f32.
//      - cuda_split: each lane loads the K and V packs of a tile (4 steps; 2 for groups of 5-8)
//        into registers, all before it computes any of them.
//      - cuda_split_async: tiles of 2 steps go through a ring of 4 tiles in shared memory by
//        cp.async, three tiles ahead of the one computed; each thread copies and reads only its
//        own 16-byte slots, so cp.async.wait_group orders its reads and the loop needs no
//        barrier. The ring becomes the warps' merge buffer after a full drain and a barrier.
//  2. Combine pass, one block per (sequence, query head): M = max_s m_s over the splits that hold
//     keys, out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s in split order (deterministic),
//     rounded once to the dtype; no key at all gives 0. It reads only workspace entries the
//     partial pass of the same call wrote.
//
// Why it is fast. The pass is bound by the K and V bytes (2 * head_dim * 2 bytes per key and kv
// head; every query head of the group shares each read), and nothing else of size moves: q, the
// partials (one (D + 2) f32 row per split and query head, a split being >= 256 keys) and out are a
// few percent. Every K/V load is a 16-byte LDG.128 (or cp.async of 16 bytes) of one row segment.
// In flight per warp for head_dim 128: 4 KiB (cuda_split, 8 packs a lane) or up to 6 KiB
// (cuda_split_async, 3 tiles x 4 packs a lane, with the registers freed for more resident
// blocks); with 12-16 warps per SM that is 48-96 KiB per SM outstanding, above the
// bandwidth-latency product of an H100 / H200 (about 20 KiB per SM). Per key the arithmetic is
// 2 * G fma per element and G reductions of log2(L) shuffles, with the max / rescale once per tile
// rather than per key, so the issue rate stays below the memory rate. The grid is sized from the
// SM count so batch 1 and batch 256 both fill the card. int64 offsets throughout; scratch is the
// stream's workspace (Note [cuda workspace]); no host synchronization, no allocation after the
// first call of a size.
#include "ops/attention/decode_split.cuh"

namespace opforge {
namespace cuda::attention_split {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kVec = 8;              // elements a lane reads of a row: 16 bytes of f16 / bf16
constexpr int64_t kMaxDim = 256;     // 32 lanes x 8 elements
constexpr int64_t kMaxGroup = 8;     // query heads per kv head held in registers
constexpr int64_t kBlocksPerSm = 4;  // resident blocks assumed when sizing the grid
template <class T> __device__ __forceinline__ Pack<T> zero_pack() {
  const uint4 raw = make_uint4(0u, 0u, 0u, 0u);
  Pack<T> out;
  __builtin_memcpy(&out, &raw, sizeof(raw));
  return out;
}

template <class T> __device__ __forceinline__ void unpack(const Pack<T>& pk, float (&f)[kVec]) {
  static_assert(Pack<T>::n == kVec);
#pragma unroll
  for (int i = 0; i < kVec; ++i) f[i] = to_f32(pk.v[i]);
}

// Keys a block handles per loop iteration: kWarps warps x (32 / L) keys a step x steps. The
// register variant holds the packs of one tile in registers (4 steps, 2 for groups of 8 to bound
// registers); the cp.async variant keeps kStages tiles of 2 steps in flight in shared memory.
constexpr int kStages = 4;
template <int L, int G, bool kAsync> struct Tile {
  static constexpr int keys_per_step = 32 / L;
  static constexpr int steps = kAsync ? 2 : (G <= 4 ? 4 : 2);
  static constexpr int64_t keys = int64_t(kWarps) * keys_per_step * steps;
};

// One tile of a lane group's keys: scores for every head (one L-lane reduction per head and key),
// then one online-softmax update per head (m, l in the base-2 domain) and the weighted V rows.
// Masked keys (valid false) carry zero packs and get weight 0; all 32 lanes must call it.
template <class T, int L, int G, int kSteps>
__device__ __forceinline__ void attend_tile(const Pack<T> (&kp)[kSteps],
                                            const Pack<T> (&vp)[kSteps],
                                            const bool (&valid)[kSteps],
                                            const float (&qf)[G][kVec], float (&m)[G],
                                            float (&l)[G], float (&acc)[G][kVec]) {
  float sc[G][kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    float kf[kVec];
    unpack(kp[s], kf);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) dot = fmaf(qf[h][i], kf[i], dot);
      sc[h][s] = group_sum<L>(dot);  // over the L lanes of this key
    }
  }
  float pw[G][kSteps];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (!valid[s]) sc[h][s] = -INFINITY;
      tile_max = fmaxf(tile_max, sc[h][s]);
    }
    const float m_new = fmaxf(m[h], tile_max);
    const bool none = m_new == -INFINITY;  // no valid key yet for these lanes
    const float corr = none ? 1.0f : exp2f(m[h] - m_new);
    l[h] *= corr;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[h][i] *= corr;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      pw[h][s] = none ? 0.0f : exp2f(sc[h][s] - m_new);  // 0 for masked keys
      l[h] += pw[h][s];
    }
    m[h] = m_new;
  }
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    float vf[kVec];
    unpack(vp[s], vf);
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[h][i] = fmaf(pw[h][s], vf[i], acc[h][i]);
  }
}

// Shared memory of a block: the cp.async ring (kAsync) and, after the key loop, the warps' states
// for the final merge (the ring is drained and a barrier passed before that reuse).
template <int L, int G, bool kAsync> struct Smem {
  static constexpr int64_t ring =
      kAsync ? int64_t(kStages) * 2 * Tile<L, G, kAsync>::steps * kThreads * 16 : 0;
  static constexpr int64_t merge = int64_t(kWarps) * G * L * kVec * 4;
  static constexpr int64_t bytes = ring > merge ? ring : merge;
};

// Resident blocks per SM the register budget is cut for (ptxas, sm_90, no spills): groups up to 4
// fit 3 blocks (<= 170 registers: 12 warps of loads in flight) in the register variant and 4 in
// the cp.async one (128 registers); groups of 5-8 keep 2 (a tighter cap spills).
template <bool kAsync, int G> constexpr int kMinBlocks = G > 4 ? 2 : kAsync ? 4 : 3;

template <class T, int L, int G, bool kAsync>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<kAsync, G>))
    split_partial_kernel(SplitArgs<T> p) {
  using TileT = Tile<L, G, kAsync>;
  constexpr int kSteps = TileT::steps, kKeysPerStep = TileT::keys_per_step;
  constexpr int64_t kTile = TileT::keys;
  __shared__ __align__(16) unsigned char smem[Smem<L, G, kAsync>::bytes];
  __shared__ float s_m[kWarps][G], s_l[kWarps][G];

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int sub = lane / L;           // which key of a warp step this lane reads
  const int col = (lane % L) * kVec;  // first of the lane's 8 elements of a row
  const bool has_col = col < p.d;
  const SplitBlock blk = split_block(p, tid);
  if (blk.begin >= blk.end) return;  // no keys in this split (its state is written)
  const int64_t split = blk.split, g = blk.g, b = blk.b;
  const int64_t begin = blk.begin, end = blk.end, head0 = blk.head0;

  float qf[G][kVec];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h < p.group && has_col) {
      unpack(load_pack_readonly(p.q + (head0 + h) * p.q_rs + col), qf[h]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) qf[h][i] *= p.scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) qf[h][i] = 0.0f;  // heads past the group score 0, unused
    }
  }
  float m[G], l[G], acc[G][kVec];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[h][i] = 0.0f;
  }

  // Row (b, j, g) of a cache starts at ((b * max_ctx + j) * Hkv + g) * row_stride; lanes past
  // head_dim never load (has_col) and keep their pointers at column 0.
  const int col_c = has_col ? col : 0;
  const T* k_row0 = p.k + (b * p.max_ctx * p.hkv + g) * p.k_rs + col_c;
  const T* v_row0 = p.v + (b * p.max_ctx * p.hkv + g) * p.v_rs + col_c;
  const int64_t k_key = p.hkv * p.k_rs, v_key = p.hkv * p.v_rs;
  // Key of step s of the tile starting at t read by this lane; (s, warp, sub) covers the tile once.
  auto key_of = [&](int64_t t, int s) {
    return t + (int64_t(s) * kWarps + warp) * kKeysPerStep + sub;
  };

  if constexpr (!kAsync) {
    for (int64_t t = begin; t < end; t += kTile) {  // the same trip count for every thread
      Pack<T> kp[kSteps], vp[kSteps];
      bool valid[kSteps];
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int64_t j = key_of(t, s);
        valid[s] = j < end;
        kp[s] = valid[s] && has_col ? load_pack_readonly(k_row0 + j * k_key) : zero_pack<T>();
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int64_t j = key_of(t, s);
        vp[s] = valid[s] && has_col ? load_pack_readonly(v_row0 + j * v_key) : zero_pack<T>();
      }
      attend_tile<T, L, G, kSteps>(kp, vp, valid, qf, m, l, acc);
    }
  } else {
    // Ring of kStages tiles in shared memory, slot [stage][pack][thread]: every thread copies and
    // reads only its own 16-byte slots, so cp.async's wait (no barrier) orders its reads.
    uint4* ring = reinterpret_cast<uint4*>(smem);
    auto slot_of = [&](int64_t stage, int pack) {
      return ring + (stage * 2 * kSteps + pack) * kThreads + tid;
    };
    const int64_t tiles = (end - begin + kTile - 1) / kTile;
    auto issue = [&](int64_t tile) {
      const int64_t t = begin + tile * kTile, stage = tile % kStages;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int64_t j = key_of(t, s);
        if (j < end && has_col) {
          __pipeline_memcpy_async(slot_of(stage, s), k_row0 + j * k_key, 16);
          __pipeline_memcpy_async(slot_of(stage, kSteps + s), v_row0 + j * v_key, 16);
        }
      }
    };
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < tiles) issue(st);
      __pipeline_commit();  // one group per tile, empty past the last, so the count below holds
    }
    for (int64_t tile = 0; tile < tiles; ++tile) {
      // The slot of tile + kStages - 1 was last read by this thread in the previous iteration.
      if (tile + kStages - 1 < tiles) issue(tile + kStages - 1);
      __pipeline_commit();
      cp_async_wait<kStages - 1>();  // groups 0 .. tile have landed: this tile's copies
      const int64_t t = begin + tile * kTile, stage = tile % kStages;
      Pack<T> kp[kSteps], vp[kSteps];
      bool valid[kSteps];
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        valid[s] = key_of(t, s) < end;
        const bool copied = valid[s] && has_col;
        if (copied) {
          const uint4 kr = *slot_of(stage, s), vr = *slot_of(stage, kSteps + s);
          __builtin_memcpy(&kp[s], &kr, 16);
          __builtin_memcpy(&vp[s], &vr, 16);
        } else {
          kp[s] = zero_pack<T>(), vp[s] = zero_pack<T>();
        }
      }
      attend_tile<T, L, G, kSteps>(kp, vp, valid, qf, m, l, acc);
    }
    cp_async_wait<0>();  // nothing in flight (the groups past the last tile are empty)
    __syncthreads();           // every thread is done with the ring before it becomes s_o
  }

  // Merge the 32 / L key slots of the warp: lane ^ off holds the same columns, another key slot.
#pragma unroll
  for (int off = L; off < 32; off *= 2) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[h], off);
      const float l_o = __shfl_xor_sync(0xffffffffu, l[h], off);
      const float m_new = fmaxf(m[h], m_o);
      const bool none = m_new == -INFINITY;
      const float c_self = none ? 0.0f : exp2f(m[h] - m_new);
      const float c_other = none ? 0.0f : exp2f(m_o - m_new);
      l[h] = l[h] * c_self + l_o * c_other;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float a_o = __shfl_xor_sync(0xffffffffu, acc[h][i], off);
        acc[h][i] = acc[h][i] * c_self + a_o * c_other;
      }
      m[h] = m_new;
    }
  }

  // Merge the warps: key slot 0 of each warp publishes its state, then each thread takes
  // (head, column) pairs and combines the warps in order.
  auto s_o = reinterpret_cast<float (*)[G][L * kVec]>(smem);  // [kWarps][G][L * kVec]
  if (lane < L) {
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int i = 0; i < kVec; ++i) s_o[warp][h][col + i] = acc[h][i];
    if (lane == 0)
#pragma unroll
      for (int h = 0; h < G; ++h) s_m[warp][h] = m[h], s_l[warp][h] = l[h];
  }
  __syncthreads();
  write_partials<kWarps>(p, &s_o[0][0][0], G * L * kVec, L * kVec, &s_m[0][0], &s_l[0][0], G, head0,
                         split, tid, kThreads);
}

int lanes_for(int64_t d) { return d <= 64 ? 8 : d <= 128 ? 16 : 32; }
int group_bucket(int64_t group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

template <class T, bool kAsync, int L, int G>
void launch_partial(const Context& ctx, SplitArgs<T>& p, int64_t batch) {
  const int64_t blocks = plan_partials(ctx, p, batch, kBlocksPerSm, Tile<L, G, kAsync>::keys);
  split_partial_kernel<T, L, G, kAsync><<<unsigned(blocks), kThreads, 0, stream_of(ctx)>>>(p);
}
template <class T, bool kAsync, int L>
void launch_group(const Context& ctx, SplitArgs<T>& p, int64_t batch) {
  switch (group_bucket(p.group)) {
    case 1: launch_partial<T, kAsync, L, 1>(ctx, p, batch); break;
    case 2: launch_partial<T, kAsync, L, 2>(ctx, p, batch); break;
    case 4: launch_partial<T, kAsync, L, 4>(ctx, p, batch); break;
    default: launch_partial<T, kAsync, L, 8>(ctx, p, batch); break;
  }
}

template <class T, bool kAsync>
void run_typed(const Context& ctx, const TensorView& out, const TensorView& q, const TensorView& k,
               const TensorView& v, const TensorView& seq_lens, double softmax_scale) {
  const int64_t batch = q.size(0);
  SplitArgs<T> p = make_args<T>(out, q, k, v, seq_lens, softmax_scale);
  switch (lanes_for(p.d)) {  // sets chunk, splits and the workspace, launches the partial pass
    case 8: launch_group<T, kAsync, 8>(ctx, p, batch); break;
    case 16: launch_group<T, kAsync, 16>(ctx, p, batch); break;
    default: launch_group<T, kAsync, 32>(ctx, p, batch); break;
  }
  check_launch("attention_decode cuda_split partial kernel launch");
  launch_combine(ctx, p, batch);
}

template <bool kAsync>
void run(const Context& ctx, const TensorView& out, const TensorView& q, const TensorView& k_cache,
         const TensorView& v_cache, const TensorView& seq_lens, double softmax_scale) {
  if (q.size(0) == 0 || q.size(1) == 0 || k_cache.size(2) == 0) return;
  DeviceGuard guard(ctx.device.index);
  if (q.dtype == DType::bf16)
    run_typed<__nv_bfloat16, kAsync>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
  else
    run_typed<__half, kAsync>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
}

}  // namespace
}  // namespace cuda::attention_split

void attention_decode_cuda_split(const Context& ctx, const TensorView& out, const TensorView& q,
                                 const TensorView& k_cache, const TensorView& v_cache,
                                 const TensorView& seq_lens, double softmax_scale) {
  cuda::attention_split::run<false>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
}
void attention_decode_cuda_split_async(const Context& ctx, const TensorView& out,
                                       const TensorView& q, const TensorView& k_cache,
                                       const TensorView& v_cache, const TensorView& seq_lens,
                                       double softmax_scale) {
  cuda::attention_split::run<true>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
}

// Both variants: the same predicate.
const char* attention_decode_cuda_split_applicable(const TensorView&, const TensorView& q,
                                                   const TensorView& k_cache,
                                                   const TensorView& v_cache,
                                                   const TensorView& seq_lens, double) {
  using namespace cuda::attention_split;
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) return "dtype is not f16 or bf16";
  const int64_t d = q.size(2), hq = q.size(1), hkv = k_cache.size(2);
  if (d % kVec != 0 || d < kVec || d > kMaxDim)
    return "head_dim is not a multiple of 8 in [8, 256]";
  if (hkv > 0 && hq / hkv > kMaxGroup) return "more than 8 query heads per kv head";
  return split_inputs_problem(q, k_cache, v_cache, seq_lens, d);
}

// Priorities: the tensor-core kernel first, then the cp.async ring, then the register-tiled one.
// On an H200 (2026-11-27, bf16, 32/8 heads x 128, context 2048, one run) cuda_split_mma ran batch
// 8 / 32 / 256 in 24.5 / 71.6 / 510.2 us against 33.4 / 108.8 / 738.4 us for cuda_split_async
// (2026-11-26: cuda_split 69 / 146 / 946 us, the older cuda kernel 148 / 421 / 2542 us).
void register_attention_decode_split_cuda(Registry& reg) {
  KernelDesc mma = cuda_kernel_desc(
      "cuda_split_mma", 170,
      "split-KV decoding on tensor cores: per warp, 16-key tiles of K and V copied by cp.async "
      "into a swizzled 3-stage ring, scores and P.V by mma.sync m16n8k16 with f32 accumulation "
      "(the group's query heads as the 16 rows), online softmax in f32, splits combined in fixed "
      "order; head_dim 64 / 128",
      false);
  mma.dtypes = {DType::f16, DType::bf16};
  mma.properties.batch_invariant = false;
  reg.add_kernel<AttentionDecode>(mma, &attention_decode_cuda_split_mma,
                                  &attention_decode_cuda_split_mma_applicable);
  KernelDesc async = cuda_kernel_desc(
      "cuda_split_async", 160,
      "as cuda_split, with the K/V packs copied by cp.async into a 4-tile per-thread ring in "
      "shared memory, so three tiles of loads fly while one is computed",
      false);
  async.dtypes = {DType::f16, DType::bf16};
  async.properties.batch_invariant = false;  // the split count depends on the batch size
  reg.add_kernel<AttentionDecode>(async, &attention_decode_cuda_split_async,
                                  &attention_decode_cuda_split_applicable);
  KernelDesc split = cuda_kernel_desc(
      "cuda_split", 150,
      "split-KV decoding: blocks of (split, kv head, sequence) sized from the SM count, 16-byte "
      "K/V loads with a tile of keys in flight per lane, the group's query heads share each row, "
      "online softmax in f32 per tile, splits combined in fixed order",
      false);
  split.dtypes = {DType::f16, DType::bf16};
  split.properties.batch_invariant = false;
  reg.add_kernel<AttentionDecode>(split, &attention_decode_cuda_split,
                                  &attention_decode_cuda_split_applicable);
}

}  // namespace opforge
