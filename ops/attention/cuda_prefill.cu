// CUDA kernels of attention_prefill: variable-length causal / windowed attention with GQA over a
// packed batch (the op's doc and Note [attention mask] in attention.h give the math).
//
// Masks in global token indices (prefill_mask.cuh): each query row finds its sequence by a binary
// search over cu_seqlens (on the device; the host never reads it) and sees the keys [lo_i, hi_i);
// offsets are clamped so no row reads outside [0, T) and every row sees its own key.
//
// Two kernels, each its own registered impl:
//  cuda_wmma (bf16, f16; head_dim 64 or 128; 16-byte aligned rows). Flash-attention style: one
//    block of 4 warps per (64-row query tile, query head); grid (ceil(T / 64), Hq), tiles taken
//    longest-first under a causal mask (blockIdx.x reversed). The tile's key range is the union of
//    its rows' ranges: key tiles above the causal diagonal or left of the window are never loaded.
//    A tile that straddles sequences loads the keys of both and masks. Per 64-key tile: K and V
//    come to shared memory with 16-byte loads (rows past T zero-filled); each warp computes its 16
//    x 64 scores with tensor cores (nvcuda::wmma 16x16x16, f32 accumulate; its Q operands stay in
//    registers for the whole block), a lane pair per row applies the mask and the online softmax in
//    f32 (exp2 with log2(e) folded into the scale) and writes P in the input dtype; the f32 output
//    accumulator O stays in registers (wmma accumulator fragments): it is rescaled per row by the
//    softmax correction (which row each fragment element holds is read once from a fragment loaded
//    from a matrix of row numbers, so no fragment layout is assumed) and O += P V runs on tensor
//    cores again. The full score matrix never exists. O / l is rounded once (staged through the
//    dead K / V tiles); lse = (m + log2 l) ln 2. Shared memory: 78.25 KiB (D = 128), 54.25 KiB
//    (D = 64), opted in per device. Performance target (not a measured figure): 8k tokens causal, 32 query /
//    8 kv heads x 128, bf16.
//  cuda_wmma2: the same kernel with two K/V buffers: while a key tile is computed, the next
//    one is copied with cp.async (__pipeline_memcpy_async, one commit group a tile, wait for all
//    but the newest); 112.25 KiB (D = 128) / 72.25 KiB (D = 64), still two blocks an SM on H100.
//    Preferred (priority 300); cuda_wmma (200) is the same math with one buffer.
//  cuda (f32, f16, bf16; any head_dim; any row stride): the plain fallback. One warp per (query
//    row, head); for each key the lanes split head_dim for the dot product (warp butterfly, fixed
//    order), online softmax in f32, output columns in chunks of 256 (8 a lane): the first chunk runs
//    the online softmax, later chunks recompute the scores with the final (m, l). Deterministic and
//    independent of the rest of the batch.
// 64-bit offsets throughout: ((token * heads + head) * row_stride + d).
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/prefill_mask.cuh"

namespace opforge {
namespace cuda::attention_prefill {
namespace {

template <class T> struct Args {
  T* out;
  float* lse;  // [Hq, T]
  const T* q;
  const T* k;
  const T* v;
  int64_t out_rs, q_rs, k_rs, v_rs;
  int64_t tokens, hq, hkv, d;
  Seqs seqs;
  bool causal;
  int64_t window_left;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
};

// ---- cuda: the plain fallback -------------------------------------------------------------------
constexpr int kSimtWarps = 4;
constexpr int kChunk = 8;  // output elements a lane holds per pass: 256 columns

template <class T> __global__ void __launch_bounds__(kSimtWarps * 32) prefill_simt_kernel(Args<T> p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = int64_t(blockIdx.x) * kSimtWarps + warp;
  const int64_t h = blockIdx.y;
  if (i >= p.tokens) return;  // the whole warp leaves; no block barrier follows
  const int64_t g = h / (p.hq / p.hkv);
  const Range r = key_range(p.seqs, i, p.causal, p.window_left);
  const T* qr = p.q + (i * p.hq + h) * p.q_rs;
  T* orow = p.out + (i * p.hq + h) * p.out_rs;
  auto score = [&](int64_t j) {
    const T* kr = p.k + (j * p.hkv + g) * p.k_rs;
    float s = 0.0f;
    for (int64_t d = lane; d < p.d; d += 32) s = fmaf(to_f32(qr[d]), to_f32(kr[d]), s);
    return group_sum<32>(s) * p.scale;
  };
  float m = -INFINITY, l = 0.0f;
  for (int64_t c0 = 0; c0 < p.d; c0 += 32 * kChunk) {
    const bool first = c0 == 0;
    float acc[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc[e] = 0.0f;
    for (int64_t j = r.lo; j < r.hi; ++j) {
      const float s = score(j);
      float pj, corr;
      if (first) {  // online softmax; the first key gives corr = exp(-inf) = 0
        const float m_new = fmaxf(m, s);
        corr = expf(m - m_new);
        pj = expf(s - m_new);
        l = l * corr + pj;
        m = m_new;
      } else {  // (m, l) are final
        corr = 1.0f;
        pj = expf(s - m);
      }
      const T* vr = p.v + (j * p.hkv + g) * p.v_rs;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int64_t d = c0 + lane + 32 * e;
        const float vv = d < p.d ? to_f32(vr[d]) : 0.0f;
        acc[e] = fmaf(acc[e], corr, pj * vv);
      }
    }
    const float inv = 1.0f / l;  // l >= 1: key i is always seen
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t d = c0 + lane + 32 * e;
      if (d < p.d) orow[d] = from_f32<T>(acc[e] * inv);
    }
  }
  if (lane == 0) p.lse[h * p.tokens + i] = m + logf(l);
}

// ---- cuda_wmma: tensor-core tiles -----------------------------------------------------------------
constexpr int kBM = 64;     // query rows a block
constexpr int kBN = 64;     // keys a tile
constexpr int kTcWarps = 4; // 16 query rows a warp

// Shared memory of one block (byte offsets; every region 128-byte aligned, every leading dimension
// a multiple of 16 bytes as wmma needs; the +8 / +4 padding staggers rows across banks). After the
// key loop the K and V tiles are dead and the f32 output rows are staged there. kStages K/V
// buffers: 1 (load, barrier, compute) or 2 (the next tile's cp.async copies fly during compute).
template <int D, int kStages> struct Layout {
  static constexpr int ldq = D + 8;    // Q, K, V tiles (16-bit elements)
  static constexpr int lds = kBN + 4;  // scores (f32)
  static constexpr int ldp = kBN + 8;  // P (16-bit)
  static constexpr int ldo = D + 4;    // output staging (f32)
  static constexpr size_t q_off = 0;
  static constexpr size_t k_off = q_off + size_t(kBM) * ldq * 2;
  static constexpr size_t tile_bytes = size_t(kBN) * ldq * 2;  // one K or V tile
  static constexpr size_t v_off = k_off + tile_bytes;               // buffer b at + 2 b tile_bytes
  static constexpr size_t s_off = k_off + size_t(kStages) * 2 * tile_bytes;
  static constexpr size_t p_off = s_off + size_t(kBM) * lds * 4;
  static constexpr size_t r_off = p_off + size_t(kBM) * ldp * 2;  // int64 lo[kBM], hi[kBM]
  static constexpr size_t c_off = r_off + size_t(kBM) * 16;       // f32 per row: corr, then 1 / l
  static constexpr size_t bytes = c_off + size_t(kBM) * 4;
  static constexpr size_t o_off = k_off;                          // staging over K and V
  static_assert(kStages == 1 || kStages == 2);
  static_assert(k_off % 128 == 0 && tile_bytes % 128 == 0 && s_off % 128 == 0 && p_off % 128 == 0 &&
                r_off % 128 == 0 && c_off % 128 == 0);
  static_assert(ldq % 8 == 0 && ldp % 8 == 0 && lds % 4 == 0 && ldo % 4 == 0);
  static_assert(size_t(kBM) * ldo * 4 <= s_off - k_off, "output staging fits over K and V");
};

template <class T, int D, int kStages>
__global__ void __launch_bounds__(kTcWarps * 32) prefill_wmma_kernel(Args<T> p) {
  namespace wmma = nvcuda::wmma;
  using L = Layout<D, kStages>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  static_assert(D % 16 == 0 && sizeof(T) == 2);
  constexpr int kDB = D / 16;    // 16-column blocks of head_dim
  constexpr int kPacks = D / 8;  // 16-byte packs a row
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem + L::q_off);
  float* ss = reinterpret_cast<float*>(smem + L::s_off);
  T* ps = reinterpret_cast<T*>(smem + L::p_off);
  float* os = reinterpret_cast<float*>(smem + L::o_off);
  int64_t* lo_s = reinterpret_cast<int64_t*>(smem + L::r_off);
  int64_t* hi_s = lo_s + kBM;
  float* row_f = reinterpret_cast<float*>(smem + L::c_off);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t tile = int64_t(gridDim.x) - 1 - int64_t(blockIdx.x);  // longest causal tiles first
  const int64_t q0 = tile * kBM;
  const int64_t h = blockIdx.y;
  const int64_t g = h / (p.hq / p.hkv);

  // Key ranges of the tile's rows; a row past T sees nothing (lo = hi = 0).
  if (tid < kBM) {
    const int64_t i = q0 + tid;
    Range r{0, 0};
    if (i < p.tokens) r = key_range(p.seqs, i, p.causal, p.window_left);
    lo_s[tid] = r.lo;
    hi_s[tid] = r.hi;
  }
  // Q tile (rows past T zero).
  for (int e = tid; e < kBM * kPacks; e += blockDim.x) {
    const int r = e / kPacks, c = (e % kPacks) * 8;
    const int64_t i = q0 + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (i < p.tokens) val = __ldg(reinterpret_cast<const uint4*>(p.q + (i * p.hq + h) * p.q_rs + c));
    *reinterpret_cast<uint4*>(qs + r * L::ldq + c) = val;
  }
  // Which row of a 16 x 16 accumulator each of this thread's elements holds: load a matrix whose
  // entry (r, c) is r and read the fragment back (load, mma and store share one element mapping),
  // so the per-row rescale below needs no assumption about that mapping.
  float* sw = ss + warp * 16 * L::lds;
  for (int e = lane; e < 256; e += 32) sw[(e / 16) * L::lds + e % 16] = float(e / 16);
  __syncthreads();
  Acc rowmap;
  wmma::load_matrix_sync(rowmap, sw, L::lds, wmma::mem_row_major);
  int row_of[Acc::num_elements];
#pragma unroll
  for (int e = 0; e < Acc::num_elements; ++e) row_of[e] = int(rowmap.x[e]);

  int64_t kv_lo = INT64_MAX, kv_hi = 0;  // union of the rows' ranges
  for (int r = 0; r < kBM; ++r)
    if (lo_s[r] < hi_s[r]) {
      kv_lo = lo_s[r] < kv_lo ? lo_s[r] : kv_lo;
      kv_hi = hi_s[r] > kv_hi ? hi_s[r] : kv_hi;
    }

  // The warp's Q rows as tensor-core operands, and its output accumulator, live in registers.
  const T* qw = qs + warp * 16 * L::ldq;
  FragA qf[kDB];
#pragma unroll
  for (int kb = 0; kb < kDB; ++kb) wmma::load_matrix_sync(qf[kb], qw + kb * 16, L::ldq);
  Acc of[kDB];
#pragma unroll
  for (int db = 0; db < kDB; ++db) wmma::fill_fragment(of[db], 0.0f);

  // The lane pair (2 r', 2 r' + 1) owns the warp's row r'; `half` picks even or odd columns.
  const int my_row = warp * 16 + (lane >> 1);
  const int half = lane & 1;
  const int64_t my_lo = lo_s[my_row], my_hi = hi_s[my_row];
  float m = -INFINITY, l = 0.0f;  // running max (log2 domain) and sum of the row
  const T* pw = ps + warp * 16 * L::ldp;
  float* corr_w = row_f + warp * 16;

  // K and V rows k0 .. k0 + kBN - 1 into buffer `buf` (rows past T zero). One stage: plain 16-byte
  // loads and stores. Two stages: cp.async copies, committed as one group per tile.
  auto fill = [&](int64_t k0, int buf) {
    T* kd = reinterpret_cast<T*>(smem + L::k_off + size_t(buf) * 2 * L::tile_bytes);
    T* vd = reinterpret_cast<T*>(smem + L::v_off + size_t(buf) * 2 * L::tile_bytes);
    for (int e = tid; e < kBN * kPacks; e += blockDim.x) {
      const int r = e / kPacks, c = (e % kPacks) * 8;
      const int64_t j = k0 + r;
      T* kdst = kd + r * L::ldq + c;
      T* vdst = vd + r * L::ldq + c;
      if (j < p.tokens) {
        const T* ksrc = p.k + (j * p.hkv + g) * p.k_rs + c;
        const T* vsrc = p.v + (j * p.hkv + g) * p.v_rs + c;
        if constexpr (kStages == 2) {
          __pipeline_memcpy_async(kdst, ksrc, 16);
          __pipeline_memcpy_async(vdst, vsrc, 16);
        } else {
          *reinterpret_cast<uint4*>(kdst) = __ldg(reinterpret_cast<const uint4*>(ksrc));
          *reinterpret_cast<uint4*>(vdst) = __ldg(reinterpret_cast<const uint4*>(vsrc));
        }
      } else {
        *reinterpret_cast<uint4*>(kdst) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(vdst) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    if constexpr (kStages == 2) __pipeline_commit();
  };
  if constexpr (kStages == 2)
    if (kv_lo < kv_hi) fill(kv_lo, 0);

  int buf = 0;
  for (int64_t k0 = kv_lo; k0 < kv_hi; k0 += kBN, buf ^= kStages - 1) {
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the previous K and V tiles
      fill(k0, 0);
    } else {
      // The other buffer was last read in the previous tile, which ended with a barrier. An empty
      // group after the last tile keeps "all but the newest group" meaning this tile.
      if (k0 + kBN < kv_hi) fill(k0 + kBN, buf ^ 1);
      else __pipeline_commit();
      __pipeline_wait_prior(1);  // this thread's copies of this tile have landed
    }
    __syncthreads();  // every thread's copies and zero rows of this tile are visible
    const T* ks = reinterpret_cast<const T*>(smem + L::k_off + size_t(buf) * 2 * L::tile_bytes);
    const T* vs = reinterpret_cast<const T*>(smem + L::v_off + size_t(buf) * 2 * L::tile_bytes);

    // S (16 x kBN) = Q_w K^T: K^T is K read as a column-major (D x kBN) matrix.
#pragma unroll
    for (int nb = 0; nb < kBN / 16; ++nb) {
      Acc sf;
      wmma::fill_fragment(sf, 0.0f);
#pragma unroll
      for (int kb = 0; kb < kDB; ++kb) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
        wmma::load_matrix_sync(b, ks + nb * 16 * L::ldq + kb * 16, L::ldq);
        wmma::mma_sync(sf, qf[kb], b, sf);
      }
      wmma::store_matrix_sync(sw + nb * 16, sf, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Mask, online softmax (log2 domain), P in the input dtype.
    float* srow = ss + my_row * L::lds;
    T* prow = ps + my_row * L::ldp;
    float mx = -INFINITY;
    for (int c = half; c < kBN; c += 2) {
      const int64_t j = k0 + c;
      const float s = (j >= my_lo && j < my_hi) ? srow[c] * p.scale_log2 : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const bool none = m_new == -INFINITY;  // the row has seen no key yet: p = 0, O stays 0
    const float corr = none ? 1.0f : exp2f(m - m_new);  // m = -inf: 0 (O and l are 0 anyway)
    float sum = 0.0f;
    for (int c = half; c < kBN; c += 2) {
      const float pj = none ? 0.0f : exp2f(srow[c] - m_new);  // masked: exp2(-inf) = 0
      prow[c] = from_f32<T>(pj);
      sum += pj;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    if (half == 0) corr_w[lane >> 1] = corr;
    __syncwarp();

    // O_w = diag(corr) O_w + P_w V.
    float ce[Acc::num_elements];
#pragma unroll
    for (int e = 0; e < Acc::num_elements; ++e) ce[e] = corr_w[row_of[e]];
    FragA pf[kBN / 16];
#pragma unroll
    for (int kb = 0; kb < kBN / 16; ++kb) wmma::load_matrix_sync(pf[kb], pw + kb * 16, L::ldp);
#pragma unroll
    for (int db = 0; db < kDB; ++db) {
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) of[db].x[e] *= ce[e];
#pragma unroll
      for (int kb = 0; kb < kBN / 16; ++kb) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
        wmma::load_matrix_sync(b, vs + kb * 16 * L::ldq + db * 16, L::ldq);
        wmma::mma_sync(of[db], pf[kb], b, of[db]);
      }
    }
    __syncwarp();  // corr_w, S and P rows are rewritten next tile
    if constexpr (kStages == 2) __syncthreads();  // every warp is done with this buffer: refill it
  }

  // Epilogue: out = O / l (rounded once), lse = (m + log2 l) ln 2; rows past T are not written.
  if (half == 0) {
    corr_w[lane >> 1] = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t i = q0 + my_row;
    if (i < p.tokens) p.lse[h * p.tokens + i] = l > 0.0f ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
  }
  __syncthreads();  // every warp is done with K and V: the staging area is free; 1 / l is visible
  float* ow = os + warp * 16 * L::ldo;
  float inv[Acc::num_elements];
#pragma unroll
  for (int e = 0; e < Acc::num_elements; ++e) inv[e] = corr_w[row_of[e]];
#pragma unroll
  for (int db = 0; db < kDB; ++db) {
#pragma unroll
    for (int e = 0; e < Acc::num_elements; ++e) of[db].x[e] *= inv[e];
    wmma::store_matrix_sync(ow + db * 16, of[db], L::ldo, wmma::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {
    const int r = e / D, c = e % D;
    const int64_t i = q0 + warp * 16 + r;
    if (i < p.tokens) p.out[(i * p.hq + h) * p.out_rs + c] = from_f32<T>(ow[r * L::ldo + c]);
  }
}

// ---- host side ----------------------------------------------------------------------------------
int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : t.size(-1); }

template <class T>
Args<T> make_args(const TensorView& out, const TensorView& lse, const TensorView& q,
                  const TensorView& k, const TensorView& v, const TensorView& cu, bool causal,
                  double softmax_scale, int64_t window_left) {
  Args<T> p{};
  p.out = out.ptr<T>(), p.q = q.ptr<T>(), p.k = k.ptr<T>(), p.v = v.ptr<T>();
  p.lse = static_cast<float*>(lse.data);
  p.out_rs = row_stride_of(out), p.q_rs = row_stride_of(q), p.k_rs = row_stride_of(k), p.v_rs = row_stride_of(v);
  p.tokens = q.size(0), p.hq = q.size(1), p.hkv = k.size(1), p.d = q.size(2);
  p.seqs = seqs_of(cu, q.size(0));
  p.causal = causal;
  p.window_left = window_left;
  const double scale = attention_scale(softmax_scale, q.size(2));
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);
  return p;
}

bool nothing_to_do(const TensorView& q) { return q.size(0) == 0 || q.size(1) == 0; }

void run_simt(const Context& ctx, const TensorView& out, const TensorView& lse, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& cu, bool causal,
              double softmax_scale, int64_t window_left) {
  if (nothing_to_do(q)) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(q.dtype, "attention_prefill", [&](auto tag) {
    using T = decltype(tag);
    const Args<T> p = make_args<T>(out, lse, q, k, v, cu, causal, softmax_scale, window_left);
    const dim3 grid(grid_for(p.tokens, kSimtWarps), unsigned(p.hq));
    prefill_simt_kernel<T><<<grid, kSimtWarps * 32, 0, stream_of(ctx)>>>(p);
    check_launch("attention_prefill kernel launch");
  });
}

// Opts the kernel into its dynamic shared memory once per device (one flag set per instance).
template <class T, int D, int kStages> void launch_wmma(const Context& ctx, const Args<T>& p) {
  using L = Layout<D, kStages>;
  auto kernel = &prefill_wmma_kernel<T, D, kStages>;
  static std::atomic<uint64_t> opted{0};
  const int dev = ctx.device.index;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit == 0 || (opted.load(std::memory_order_acquire) & bit) == 0) {
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(L::bytes)));
    opted.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(grid_for(p.tokens, kBM), unsigned(p.hq));
  kernel<<<grid, kTcWarps * 32, L::bytes, stream_of(ctx)>>>(p);
  check_launch("attention_prefill wmma kernel launch");
}

template <class T, int kStages>
void run_wmma_typed(const Context& ctx, const TensorView& out, const TensorView& lse,
                    const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& cu, bool causal, double softmax_scale, int64_t window_left) {
  const Args<T> p = make_args<T>(out, lse, q, k, v, cu, causal, softmax_scale, window_left);
  if (p.d == 64) launch_wmma<T, 64, kStages>(ctx, p);
  else launch_wmma<T, 128, kStages>(ctx, p);
}

template <int kStages>
void run_wmma(const Context& ctx, const TensorView& out, const TensorView& lse, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& cu, bool causal,
              double softmax_scale, int64_t window_left) {
  if (nothing_to_do(q)) return;
  DeviceGuard guard(ctx.device.index);
  if (q.dtype == DType::bf16)
    run_wmma_typed<__nv_bfloat16, kStages>(ctx, out, lse, q, k, v, cu, causal, softmax_scale, window_left);
  else if (q.dtype == DType::f16)
    run_wmma_typed<__half, kStages>(ctx, out, lse, q, k, v, cu, causal, softmax_scale, window_left);
  else
    throw Error(ErrorCode::internal, std::string("attention_prefill: wmma kernel called with dtype ") +
                                         dtype_name(q.dtype));
}

}  // namespace
}  // namespace cuda::attention_prefill

void attention_prefill_cuda(const Context& ctx, const TensorView& out, const TensorView& lse,
                            const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& cu_seqlens, bool causal, double softmax_scale,
                            int64_t window_left) {
  cuda::attention_prefill::run_simt(ctx, out, lse, q, k, v, cu_seqlens, causal, softmax_scale, window_left);
}

const char* attention_prefill_cuda_applicable(const TensorView&, const TensorView& lse,
                                              const TensorView& q, const TensorView&,
                                              const TensorView&, const TensorView&, bool, double,
                                              int64_t) {
  if (!cuda::is_cuda_float(q.dtype)) return cuda::kNotCudaFloat;
  if (lse.dtype != DType::f32) return "lse is not f32";
  if (q.size(1) > 65535) return "more than 65535 query heads";
  return nullptr;
}

void attention_prefill_cuda_wmma(const Context& ctx, const TensorView& out, const TensorView& lse,
                                 const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& cu_seqlens, bool causal, double softmax_scale,
                                 int64_t window_left) {
  cuda::attention_prefill::run_wmma<1>(ctx, out, lse, q, k, v, cu_seqlens, causal, softmax_scale, window_left);
}

void attention_prefill_cuda_wmma_async(const Context& ctx, const TensorView& out,
                                       const TensorView& lse, const TensorView& q,
                                       const TensorView& k, const TensorView& v,
                                       const TensorView& cu_seqlens, bool causal,
                                       double softmax_scale, int64_t window_left) {
  cuda::attention_prefill::run_wmma<2>(ctx, out, lse, q, k, v, cu_seqlens, causal, softmax_scale, window_left);
}

namespace {

// The tensor-core kernels' predicate; `stages` picks the shared memory they need.
const char* wmma_applicable(const TensorView& out, const TensorView& lse, const TensorView& q,
                            const TensorView& k, const TensorView& v, int stages) {
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) return "dtype is not bf16 or f16";
  if (lse.dtype != DType::f32) return "lse is not f32";
  const int64_t d = q.size(2);
  if (d != 64 && d != 128) return "head_dim is not 64 or 128";
  if (q.size(1) > 65535) return "more than 65535 query heads";
  for (const TensorView* t : {&out, &q, &k, &v})
    if (t->numel() > 0)
      if (const char* why = cuda::pack_rows_problem(*t, d)) return why;
  using cuda::attention_prefill::Layout;
  const size_t need = stages == 1 ? (d == 64 ? Layout<64, 1>::bytes : Layout<128, 1>::bytes)
                                  : (d == 64 ? Layout<64, 2>::bytes : Layout<128, 2>::bytes);
  if (q.numel() > 0 && !q.device.is_cpu() &&
      cuda_device_props(q.device.index).shared_per_block_optin < int64_t(need))
    return stages == 1 ? "the device has less than 78.25 KiB (head_dim 128) or 54.25 KiB (64) of shared memory a block"
                       : "the device has less than 112.25 KiB (head_dim 128) or 72.25 KiB (64) of shared memory a block";
  return nullptr;
}

}  // namespace

const char* attention_prefill_cuda_wmma_applicable(const TensorView& out, const TensorView& lse,
                                                   const TensorView& q, const TensorView& k,
                                                   const TensorView& v, const TensorView&, bool,
                                                   double, int64_t) {
  return wmma_applicable(out, lse, q, k, v, 1);
}

const char* attention_prefill_cuda_wmma_async_applicable(const TensorView& out,
                                                         const TensorView& lse, const TensorView& q,
                                                         const TensorView& k, const TensorView& v,
                                                         const TensorView&, bool, double, int64_t) {
  return wmma_applicable(out, lse, q, k, v, 2);
}

void register_attention_prefill_cuda(Registry& reg) {
  KernelDesc async = cuda_kernel_desc(
      "cuda_wmma2", 300,
      "as cuda_wmma, with two K/V buffers: the next key tile's cp.async copies fly while the "
      "current one is computed",
      false);
  async.dtypes = {DType::f16, DType::bf16};
  async.properties.batch_invariant = false;
  reg.add_kernel<AttentionPrefill>(async, &attention_prefill_cuda_wmma_async,
                                   &attention_prefill_cuda_wmma_async_applicable);
  KernelDesc wmma = cuda_kernel_desc(
      "cuda_wmma", 200,
      "flash-style tiles: 64 query rows x 64-key tiles in shared memory, QK^T and PV on tensor "
      "cores (wmma 16x16x16, f32 accumulate), online softmax in f32, causal / window tiles skipped",
      false);
  wmma.dtypes = {DType::f16, DType::bf16};
  wmma.properties.batch_invariant = false;  // key tiles start where the tile's rows' keys start
  reg.add_kernel<AttentionPrefill>(wmma, &attention_prefill_cuda_wmma,
                                   &attention_prefill_cuda_wmma_applicable);
  reg.add_kernel<AttentionPrefill>(
      cuda_kernel_desc("cuda", 100,
                       "one warp per (query, head): lanes split head_dim, online softmax in f32, "
                       "any head_dim and row stride",
                       false),
      &attention_prefill_cuda, &attention_prefill_cuda_applicable);
}

}  // namespace opforge
