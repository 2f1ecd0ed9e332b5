// CUDA kernel `cuda_split_mma` of attention_decode: split-KV decoding with the scores and the
// weighted V rows on tensor cores (mma.sync m16n8k16, f32 accumulation), for head_dim 64 or 128
// and up to 16 query heads per kv head. The split plan, the workspace of partial states and the
// combine pass are those of cuda_split / cuda_split_async (decode_split.cuh).
//
// Math (the op's doc): out[b, h] = sum_{j < len_b} softmax_j(scale * q[b, h] . k[b, j, g])
// v[b, j, g], g = h / (Hq / Hkv); a sequence of length 0 gives 0. seq_lens stays on the device;
// no cache row at or past len_b is read (the copies of those rows are zero-filled instead).
//
// Where it differs from cuda_split_async: the weights p = 2^(s - m) are rounded to the cache's
// dtype before the product with V (the tensor cores take 16-bit operands), and l sums the same
// rounded weights, so out stays a convex combination of the V rows; the scores, the running
// maximum, l and the accumulator are f32 as there.
//
// Assumptions (attention_decode_cuda_split_mma_applicable names the one that fails): f16 or bf16;
// head_dim 64 or 128; Hq / Hkv <= 16; q, k_cache and v_cache 16-byte aligned with row strides a
// multiple of 8 elements; batch * Hkv <= 2^20; seq_lens int32.
//
// Launch shape. One block of 4 warps per (split, kv head, sequence), the split a multiple of 64
// keys, the split count chosen for whole waves of 2 (head_dim 128) or 4 (64) resident blocks per
// SM (plan_balanced). Warp
// w takes the 16-key tiles w, w + 4, w + 8, ... of its split, each warp on its own: it copies a
// tile's K and V rows by cp.async (16 bytes a lane and copy) into its own ring of 3 stages in
// shared memory, two tiles ahead of the one it computes, and needs only __syncwarp between them.
// Rows are stored with their 16-byte chunks XOR-swizzled by (row mod 8), so the ldmatrix reads
// of 8 rows at one column hit 8 different bank groups. Per tile:
//   S^T [16 heads x 16 keys] = Q [16 x D] . K^T: D/16 k-steps of two m16n8k16 (Q's fragments,
//     heads past the group zero, stay in registers for the whole split; K^T's come from
//     ldmatrix.x4 of the tile's rows), scaled by scale * log2(e) in f32;
//   online softmax per head row, in the accumulator's layout (a lane holds 2 rows x 4 keys; the
//     row maximum needs two shuffles);
//   O [16 x D] += P [16 x 16] . V [16 x D]: P's A fragments are the score accumulators converted
//     in place, V's B fragments come from ldmatrix.x4.trans; D/8 mma per tile.
// The 4 warps' (m, l, O) are merged in warp order through shared memory (write_partials).
//
// Why it is fast. cuda_split_async spends about 350 instructions a lane per 4 keys (fma on
// scalars, a shuffle reduction per key and head, the dtype conversions); on an H200 it ran at
// the same speed as on an H100 (744 us at batch 256, context 2048), bound by issue rather than by
// memory. Here a 16-key tile (8 KiB of K and V at head_dim 128) costs 16 ldmatrix, 32 mma and
// about 120 other instructions a lane, so the pass stays bound by the bytes: 16 KiB in flight per
// warp (two tiles ahead), 8-16 warps per SM. int64 offsets throughout; scratch is the stream's
// workspace; no host synchronization, no allocation after the first call of a size.
#include <atomic>
#include <type_traits>

#include "ops/attention/decode_split.cuh"

namespace opforge {
namespace cuda::attention_split {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kTileKeys = 16;    // keys per warp tile (two n8 blocks of S^T, one k16 step of P.V)
constexpr int kRows = 16;        // query heads per kv head the m16 rows hold
constexpr int kMmaStages = 3;    // ring stages per warp

template <int D> constexpr int kMmaBlocksPerSm = D > 64 ? 2 : 4;  // shared memory per block below
template <class T, int D> struct MmaSmem {
  static constexpr int64_t stage = int64_t(2) * kTileKeys * D * int64_t(sizeof(T));  // K and V
  static constexpr int64_t ring = int64_t(kMmaWarps) * kMmaStages * stage;
  static constexpr int64_t merge = int64_t(kMmaWarps) * kRows * D * 4;  // f32 O of each warp
  static constexpr int64_t bytes = ring > merge ? ring : merge;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; src_bytes 0 fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a . b for one m16n8k16 tile, 16-bit operands of type T, f32 accumulators.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 rounded to T, packed low / high into one 32-bit operand register; lo and hi are set to
// the rounded values.
template <class T> __device__ __forceinline__ uint32_t pack2(float& lo, float& hi) {
  const T a = from_f32<T>(lo), b = from_f32<T>(hi);
  lo = to_f32(a), hi = to_f32(b);
  uint16_t ua, ub;
  __builtin_memcpy(&ua, &a, 2);
  __builtin_memcpy(&ub, &b, 2);
  return uint32_t(ua) | (uint32_t(ub) << 16);
}

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows x D] tile: chunks XOR-swizzled
// by (row mod 8) (D / 8 >= 8 chunks a row).
template <int D> __device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

template <class T, int D>
__global__ void __launch_bounds__(kMmaThreads, kMmaBlocksPerSm<D>) split_mma_kernel(SplitArgs<T> p) {
  constexpr int kChunks = D / 8;          // 16-byte chunks of a row
  constexpr int kCopies = kTileKeys * kChunks / 32;  // cp.async a lane issues per tile and tensor
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float s_m[kMmaWarps][kRows], s_l[kMmaWarps][kRows];

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;  // mma fragment row group and thread in group
  const SplitBlock blk = split_block(p, tid);
  if (blk.begin >= blk.end) return;  // no keys in this split (its state is written)
  const int64_t split = blk.split, g = blk.g, b = blk.b;
  const int64_t begin = blk.begin, end = blk.end, head0 = blk.head0;

  // Q's A fragments for every k-step: rows gid and gid + 8, columns 2 tig (+1) and 2 tig + 8 (+9)
  // of the step; query heads past the group are zero.
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = gid + (r & 1) * 8, col = kk * 16 + tig * 2 + (r >> 1) * 8;
      qa[kk][r] = row < p.group
                      ? __ldg(reinterpret_cast<const uint32_t*>(p.q + (head0 + row) * p.q_rs + col))
                      : 0u;
    }
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows gid, gid + 8
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  const T* k_row0 = p.k + (b * p.max_ctx * p.hkv + g) * p.k_rs;
  const T* v_row0 = p.v + (b * p.max_ctx * p.hkv + g) * p.v_rs;
  const int64_t k_key = p.hkv * p.k_rs, v_key = p.hkv * p.v_rs;
  T* ring = reinterpret_cast<T*>(smem) + int64_t(warp) * kMmaStages * 2 * kTileKeys * D;
  const int64_t first = begin + int64_t(warp) * kTileKeys;  // the warp's first key
  const int64_t tiles = first < end ? (end - first + kMmaWarps * kTileKeys - 1) / (kMmaWarps * kTileKeys) : 0;

  auto issue = [&](int64_t t) {  // copies of the warp's tile t into stage t mod kMmaStages
    const int64_t key0 = first + t * (kMmaWarps * kTileKeys);
    T* ks = ring + (t % kMmaStages) * 2 * kTileKeys * D;
    T* vs = ks + kTileKeys * D;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int c = lane + 32 * i, row = c / kChunks, chunk = c % kChunks;
      const int64_t j = key0 + row;
      const bool ok = j < end;
      const int64_t jj = ok ? j : begin;  // a row of this sequence; nothing is read when !ok
      cp_async16(ks + swz<D>(row, chunk), k_row0 + jj * k_key + chunk * 8, ok ? 16 : 0);
      cp_async16(vs + swz<D>(row, chunk), v_row0 + jj * v_key + chunk * 8, ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int st = 0; st < kMmaStages - 1; ++st) {
    if (st < tiles) issue(st);
    cp_async_commit();  // one group per tile, empty past the last, so the wait count below holds
  }
  for (int64_t t = 0; t < tiles; ++t) {
    __syncwarp();  // every lane is done reading the stage refilled next (read at t - 1)
    if (t + kMmaStages - 1 < tiles) issue(t + kMmaStages - 1);
    cp_async_commit();
    cp_async_wait<kMmaStages - 1>();  // this lane's copies of tile t have landed
    __syncwarp();                     // and every other lane's
    const T* ks = ring + (t % kMmaStages) * 2 * kTileKeys * D;
    const T* vs = ks + kTileKeys * D;
    const int64_t key0 = first + t * (kMmaWarps * kTileKeys);

    // S^T: sc[n] holds heads (gid, gid + 8) x keys 8 n + 2 tig (+1).
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: the matrix and row this lane addresses
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kb[4];  // (keys 0-7, dims lo), (keys 0-7, dims hi), (keys 8-15, lo), (8-15, hi)
      ldmatrix_x4(kb, ks + swz<D>(mr + (mi >> 1) * 8, kk * 2 + (mi & 1)));
      mma16816<T>(sc[0], qa[kk], kb[0], kb[1]);
      mma16816<T>(sc[1], qa[kk], kb[2], kb[3]);
    }

    // Online softmax per row, base 2; masked keys (past end) score -inf and weigh 0.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = key0 + n * 8 + tig * 2 + (e & 1) < end;
        sc[n][e] = valid ? sc[n][e] * p.scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      corr[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
      mx[r] = m_new;  // from here the row's new maximum
      m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mr_ = mx[e >> 1];
        sc[n][e] = mr_ == -INFINITY ? 0.0f : exp2f(sc[n][e] - mr_);
      }
    // P's A fragment: (row gid, keys 2 tig..), (gid + 8, ..), (gid, 8 + 2 tig..), (gid + 8, ..).
    uint32_t pa[4];
    pa[0] = pack2<T>(sc[0][0], sc[0][1]);
    pa[1] = pack2<T>(sc[0][2], sc[0][3]);
    pa[2] = pack2<T>(sc[1][0], sc[1][1]);
    pa[3] = pack2<T>(sc[1][2], sc[1][3]);
    l[0] = l[0] * corr[0] + ((sc[0][0] + sc[0][1]) + (sc[1][0] + sc[1][1]));
    l[1] = l[1] * corr[1] + ((sc[0][2] + sc[0][3]) + (sc[1][2] + sc[1][3]));
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr[0], o[n][1] *= corr[0];
      o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t vb[4];  // (keys 0-7, dims lo), (keys 8-15, lo), (keys 0-7, hi), (keys 8-15, hi)
      ldmatrix_x4_trans(vb, vs + swz<D>(mr + (mi & 1) * 8, dd * 2 + (mi >> 1)));
      mma16816<T>(o[2 * dd], pa, vb[0], vb[1]);
      mma16816<T>(o[2 * dd + 1], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();  // nothing in flight (the groups past the last tile are empty)

  // l: the four lanes of a row group hold parts of the row's sum; m is the same in all four.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // every warp is done with its ring before it becomes s_o
  float* s_o = reinterpret_cast<float*>(smem);  // [kMmaWarps][kRows][D]
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s_o[(warp * kRows + gid + (e >> 1) * 8) * D + n * 8 + tig * 2 + (e & 1)] = o[n][e];
  if (tig == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) s_m[warp][gid + r * 8] = m[r], s_l[warp][gid + r * 8] = l[r];
  __syncthreads();
  write_partials<kMmaWarps>(p, s_o, kRows * D, D, &s_m[0][0], &s_l[0][0], kRows, head0, split,
                            tid, kMmaThreads);
}

template <class T, int D> void launch_mma(const Context& ctx, SplitArgs<T>& p, int64_t batch) {
  constexpr int64_t kSmem = MmaSmem<T, D>::bytes;
  static std::atomic<uint64_t> opted{0};  // devices this instantiation was opted in on (bit = index)
  const int dev = ctx.device.index;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit == 0 || (opted.load(std::memory_order_acquire) & bit) == 0) {  // above the 48 KiB default
    check(cudaFuncSetAttribute(split_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(kSmem)),
          "attention_decode cuda_split_mma: shared memory attribute");
    opted.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int64_t blocks =
      plan_partials(ctx, p, batch, kMmaBlocksPerSm<D>, kMmaWarps * kTileKeys, /*balanced=*/true);
  split_mma_kernel<T, D><<<unsigned(blocks), kMmaThreads, kSmem, stream_of(ctx)>>>(p);
  check_launch("attention_decode cuda_split_mma partial kernel launch");
  launch_combine(ctx, p, batch);
}

template <class T>
void run_mma_typed(const Context& ctx, const TensorView& out, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& seq_lens,
                   double softmax_scale) {
  const int64_t batch = q.size(0);
  SplitArgs<T> p = make_args<T>(out, q, k, v, seq_lens, softmax_scale);
  if (p.d == 64) launch_mma<T, 64>(ctx, p, batch);
  else launch_mma<T, 128>(ctx, p, batch);
}

}  // namespace
}  // namespace cuda::attention_split

void attention_decode_cuda_split_mma(const Context& ctx, const TensorView& out, const TensorView& q,
                                     const TensorView& k_cache, const TensorView& v_cache,
                                     const TensorView& seq_lens, double softmax_scale) {
  using namespace cuda::attention_split;
  if (q.size(0) == 0 || q.size(1) == 0 || k_cache.size(2) == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  if (q.dtype == DType::bf16)
    run_mma_typed<__nv_bfloat16>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
  else
    run_mma_typed<__half>(ctx, out, q, k_cache, v_cache, seq_lens, softmax_scale);
}

const char* attention_decode_cuda_split_mma_applicable(const TensorView&, const TensorView& q,
                                                       const TensorView& k_cache,
                                                       const TensorView& v_cache,
                                                       const TensorView& seq_lens, double) {
  using namespace cuda::attention_split;
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) return "dtype is not f16 or bf16";
  const int64_t d = q.size(2), hq = q.size(1), hkv = k_cache.size(2);
  if (d != 64 && d != 128) return "head_dim is not 64 or 128";
  if (hkv > 0 && hq / hkv > kRows) return "more than 16 query heads per kv head";
  return split_inputs_problem(q, k_cache, v_cache, seq_lens, d);
}

}  // namespace opforge
