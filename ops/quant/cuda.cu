// CUDA kernels of quant_fp8 (Note [fp8 quantization] in ops/quant/quant.h): x (f32, f16, bf16) to
// f8e4m3fn with a per-tensor dynamic, per-token dynamic or static scale.
//
// Bit-exact with the reference. Every step is the reference's f32 arithmetic: amax = max |x| by
// fmaxf (NaN elements ignored, as the reference's `a > amax`; max is exact in any order), s =
// max(amax / 448, 1 / (448 * 512)), inv = 1 / s and x * inv with IEEE division and multiply (no
// fast-math: the build does not pass -use_fast_math, so `/` is correctly rounded). The narrowing
// is the hardware's cvt.rn.satfinite.e4m3x2.f32 (cuda_fp8.h's __nv_cvt_float2_to_fp8x2 with
// __NV_SATFINITE): round to nearest even, subnormals included, and every |v| >= 448, infinities
// included, saturates to +-448, as Note [fp8 e4m3]. NaN: the hardware writes the canonical 0x7f
// whatever the sign, which is what the reference defines for a NaN quotient.
//
// Modes and launches (all on ctx.stream, no host synchronization, no allocation after the first
// call with a larger grid; every launch but the cooperative one is programmatic, Note
// [programmatic launch] in cuda_launch.cuh):
//  - cuda_vec16_coop (priority 300; per_tensor with contiguous x and q, x 16-byte aligned, q
//    aligned to N bytes): one cooperative launch (Note [one-launch per-tensor quant]): a grid-wide
//    amax of 16-byte loads, a grid barrier, then the quantize pass in reverse order. Bytes per
//    element: x read twice (the second time partly, at 1024 x 4096 entirely, from L2) and q written
//    once. The kernels below stay as the fallback (padded rows, other modes).
//  - per_tensor, three launches: (1) amax partials, one per block of a grid of at most 8 blocks
//    per SM, into the per-stream workspace (Note [cuda workspace]); (2) one block reduces the
//    partials, writes scale[0] = s; (3) the quantize kernel reads s = scale[0] on the device and
//    computes inv itself. The scale never visits the host.
//  - static: the quantize kernel reads s = static_scale[0] on the device; its first thread copies
//    it to scale[0]. (The check validates static_scale's value only when it lives on the host.)
//  - per_token, one launch: a block per row (grid-stride over rows), block max of |x| over the
//    row, thread 0 writes scale[row], then the row is read again (from L1/L2) and quantized.
// Technique: cuda_vec16 reads x as 16-byte packs (8 bf16/f16 or 4 f32) and writes their N bytes
// of q in one 8- or 4-byte store; it needs 16-byte aligned x rows (base, row stride), q rows
// aligned to N bytes (base, row stride) and hidden a multiple of N (the predicate says which
// fails). cuda: one element per step, any layout the check accepts. Launch shape of (1) and (3):
// 2-D blocks of 256 threads, x over column units of a row (up to 256, a power of two), y over
// rows, both dimensions looping; int64 offsets (row * row_stride + column).
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/quant/internal.h"
#include "ops/quant/quant_cuda.h"

namespace opforge {
namespace cuda::quant {
namespace {

constexpr float kMinScale = 1.0f / (448.0f * 512.0f);  // kFp8MinScale (internal.h)

template <class T> struct Args {
  const T* x;
  uint8_t* q;
  int64_t x_stride, q_stride;  // row strides in elements (bytes for q)
  int64_t rows, hidden;
};

__device__ __forceinline__ float scale_of(float amax) {
  const float s = amax / 448.0f;
  return s > kMinScale ? s : kMinScale;
}

// Two values x * inv to two e4m3 bytes: a in the low byte, b in the high byte. A NaN becomes the
// canonical 0x7f, as the reference defines it.
__device__ __forceinline__ uint32_t to_e4m3x2(float xa, float xb, float inv) {
  return __nv_cvt_float2_to_fp8x2(make_float2(xa * inv, xb * inv), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ uint8_t to_e4m3(float x, float inv) {
  return uint8_t(__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3));
}

// max |x| over this thread's part of one column unit.
template <class T, bool kVec>
__device__ __forceinline__ float unit_amax(const T* x, int64_t col, float amax) {
  if constexpr (kVec) {
    const Pack<T> p = load_pack(x + col);
#pragma unroll
    for (int j = 0; j < Pack<T>::n; ++j) amax = fmaxf(amax, fabsf(to_f32(p.v[j])));
    return amax;
  } else {
    return fmaxf(amax, fabsf(to_f32(x[col])));
  }
}

// q[0, N) = e4m3(p * inv) for one pack, one 8-byte (N = 8) or 4-byte (N = 4) store.
template <class T>
__device__ __forceinline__ void store_quant_pack(const Pack<T>& p, uint8_t* q, float inv) {
  constexpr int N = Pack<T>::n;  // 4 (f32) or 8 (f16, bf16)
  uint32_t w[N / 4];
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    const uint32_t lo = to_e4m3x2(to_f32(p.v[4 * k]), to_f32(p.v[4 * k + 1]), inv);
    const uint32_t hi = to_e4m3x2(to_f32(p.v[4 * k + 2]), to_f32(p.v[4 * k + 3]), inv);
    w[k] = lo | (hi << 16);
  }
  if constexpr (N == 8) *reinterpret_cast<uint2*>(q) = make_uint2(w[0], w[1]);
  else *reinterpret_cast<uint32_t*>(q) = w[0];
}

// q = e4m3(x * inv) for one column unit.
template <class T, bool kVec>
__device__ __forceinline__ void unit_quant(const T* x, uint8_t* q, int64_t col, float inv) {
  if constexpr (kVec) {
    store_quant_pack(load_pack(x + col), q + col, inv);
  } else {
    q[col] = to_e4m3(to_f32(x[col]), inv);
  }
}

// ---- per_tensor (1): amax partials, one per block ------------------------------------------------
template <class T, bool kVec>
__global__ void __launch_bounds__(256) amax_partial_kernel(Args<T> a, float* partial) {
  __shared__ float scratch[32];
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = a.hidden / width;
  float amax = 0.0f;
  const int64_t col_step = int64_t(gridDim.x) * blockDim.x;
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < a.rows; row += row_step) {
    const T* x = a.x + row * a.x_stride;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += col_step)
      amax = unit_amax<T, kVec>(x, u * width, amax);
  }
  amax = block_max(amax, scratch);
  if (threadIdx.x == 0 && threadIdx.y == 0) partial[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = amax;
}

// ---- per_tensor (2): one block: scale[0] = s(max of the partials) --------------------------------
__global__ void __launch_bounds__(256) amax_finish_kernel(const float* partial, int64_t parts,
                                                          float* scale) {
  __shared__ float scratch[32];
  programmatic_prologue();  // Note [programmatic launch]
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) amax = fmaxf(amax, partial[i]);
  amax = block_max(amax, scratch);
  if (threadIdx.x == 0) scale[0] = scale_of(amax);
}

// ---- per_tensor (3) and static: quantize with s read on the device ------------------------------
template <class T, bool kVec>
__global__ void __launch_bounds__(256) quant_kernel(Args<T> a, const float* s_src, float* s_dst) {
  programmatic_prologue();  // Note [programmatic launch]
  const float s = *s_src;
  const bool first = blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0;
  if (s_dst && first) *s_dst = s;
  const float inv = 1.0f / s;
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = a.hidden / width;
  const int64_t col_step = int64_t(gridDim.x) * blockDim.x;
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < a.rows; row += row_step) {
    const T* x = a.x + row * a.x_stride;
    uint8_t* q = a.q + row * a.q_stride;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += col_step)
      unit_quant<T, kVec>(x, q, u * width, inv);
  }
}

// ---- per_token: a block per row ------------------------------------------------------------------
template <class T, bool kVec>
__global__ void __launch_bounds__(256) per_token_kernel(Args<T> a, float* scales,
                                                        int64_t scale_stride, bool has_ub,
                                                        float ub) {
  __shared__ float scratch[32];
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = a.hidden / width;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {  // block-uniform
    const T* x = a.x + row * a.x_stride;
    float amax = 0.0f;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) amax = unit_amax<T, kVec>(x, u * width, amax);
    amax = block_max(amax, scratch);
    if (has_ub && amax > ub) amax = ub;
    const float s = scale_of(amax);
    if (threadIdx.x == 0) scales[row * scale_stride] = s;
    const float inv = 1.0f / s;
    uint8_t* q = a.q + row * a.q_stride;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) unit_quant<T, kVec>(x, q, u * width, inv);
  }
}

// ---- per_tensor, cooperative: amax and quantize in one launch ------------------------------------
// Note [one-launch per-tensor quant]: x and q contiguous, seen as flat arrays of n elements:
// n / N packs, then n % N tail elements (scalar, by the last block). G resident blocks (a
// cooperative launch); block b owns the packs [b * C, (b + 1) * C) and walks them in steps of
// kCoopUnroll * blockDim.x packs (all kCoopUnroll loads of a thread issued before their use).
// Phase 1: the block's max |x| to partial[b]. A grid barrier (Note [grid barrier]). Phase 2: every
// block takes the max of the G partials itself (max is exact in any order, so all agree on s;
// block 0 writes scale[0]), then quantizes its packs in reverse step order: the last step's
// packs are still in registers, and the most recently read ones, the likeliest to still be in L2,
// come next (at 1024 x 4096 bf16 all of x fits in L2 and phase 2 reads none of it from DRAM). No workspace beyond G floats, no host round trip,
// one launch instead of three.
constexpr int kCoopThreads = 512;
constexpr int kCoopUnroll = 4;

template <class T> struct FlatArgs {
  const T* x;
  uint8_t* q;
  int64_t n;  // elements
};

template <class T>
__global__ void __launch_bounds__(kCoopThreads)
    per_tensor_coop_kernel(FlatArgs<T> a, float* partial, unsigned* barrier, float* scale_out) {
  constexpr int N = Pack<T>::n;
  constexpr int U = kCoopUnroll;
  __shared__ float scratch[32];
  programmatic_prologue();  // Note [programmatic launch]
  const int64_t packs = a.n / N;
  const int64_t per_block = (packs + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(packs, int64_t(blockIdx.x) * per_block);
  const int64_t end = min(packs, begin + per_block);
  const int64_t span = int64_t(U) * blockDim.x;
  const int64_t steps = (end - begin + span - 1) / span;
  const bool tail_block = blockIdx.x == gridDim.x - 1;

  float amax = 0.0f;
  Pack<T> v[U];  // after phase 1: the packs of the last step, quantized from registers
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t p0 = begin + step * span + threadIdx.x;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (p0 + int64_t(u) * blockDim.x < end) v[u] = load_pack(a.x + (p0 + int64_t(u) * blockDim.x) * N);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (p0 + int64_t(u) * blockDim.x < end)
#pragma unroll
        for (int j = 0; j < N; ++j) amax = fmaxf(amax, fabsf(to_f32(v[u].v[j])));
  }
  if (tail_block)
    for (int64_t e = packs * N + threadIdx.x; e < a.n; e += blockDim.x)
      amax = fmaxf(amax, fabsf(to_f32(a.x[e])));
  amax = block_max(amax, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = amax;

  grid_barrier(barrier, gridDim.x);

  float all = 0.0f;
  for (int64_t i = threadIdx.x; i < gridDim.x; i += blockDim.x) all = fmaxf(all, __ldcg(partial + i));
  all = block_max(all, scratch);
  const float s = scale_of(all);
  if (blockIdx.x == 0 && threadIdx.x == 0) scale_out[0] = s;
  const float inv = 1.0f / s;
  if (tail_block)
    for (int64_t e = packs * N + threadIdx.x; e < a.n; e += blockDim.x)
      a.q[e] = to_e4m3(to_f32(a.x[e]), inv);
  for (int64_t step = steps - 1; step >= 0; --step) {
    const int64_t p0 = begin + step * span + threadIdx.x;
    if (step != steps - 1)
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (p0 + int64_t(u) * blockDim.x < end) v[u] = load_pack(a.x + (p0 + int64_t(u) * blockDim.x) * N);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (p0 + int64_t(u) * blockDim.x < end)
        store_quant_pack(v[u], a.q + (p0 + int64_t(u) * blockDim.x) * N, inv);
  }
}

template <class T>
void launch_per_tensor_coop(const Context& ctx, const FlatArgs<T>& a, float* scale_out) {
  auto kernel = per_tensor_coop_kernel<T>;
  static std::atomic<int> per_sm{0};  // blocks of this instantiation that fit on an SM
  int fit = per_sm.load(std::memory_order_relaxed);
  if (fit == 0) {
    OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kCoopThreads, 0));
    fit = std::max(fit, 1);
    per_sm.store(fit, std::memory_order_relaxed);
  }
  const int64_t resident = int64_t(fit) * cuda_device_props(ctx.device.index).sm_count;
  const int64_t span = int64_t(kCoopUnroll) * kCoopThreads;
  const int64_t packs = a.n / Pack<T>::n;
  const int64_t blocks = std::max<int64_t>(1, std::min(resident, (packs + span - 1) / span));
  auto* partial = static_cast<float*>(cuda_workspace(ctx, blocks * int64_t(sizeof(float))));
  unsigned* barrier = cuda_grid_barrier(ctx);
  launch_cooperative(ctx, "quant_fp8_cuda_vec16_coop cooperative launch", kernel, blocks, kCoopThreads,
                     0, a, partial, barrier, scale_out);
}

// ---- launchers -----------------------------------------------------------------------------------
int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

// The 2-D shape of (1) and (3): at most `max_blocks` blocks.
struct Grid2 {
  dim3 grid, block;
};
Grid2 grid2(int64_t units, int64_t rows, int64_t max_blocks) {
  int bx = 1;
  while (bx < units && bx < 256) bx *= 2;
  const int by = 256 / bx;
  const int64_t gx = std::max<int64_t>(1, std::min((units + bx - 1) / bx, max_blocks));
  const int64_t gy = std::max<int64_t>(
      1, std::min({(rows + by - 1) / by, std::max<int64_t>(1, max_blocks / gx), int64_t(65535)}));
  return {dim3(unsigned(gx), unsigned(gy)), dim3(unsigned(bx), unsigned(by))};
}

template <class T, bool kVec>
void launch(const Context& ctx, const Args<T>& a, QuantMode mode, const TensorView& scale,
            const TensorView& static_scale, double scale_ub) {
  const int64_t units = a.hidden / (kVec ? Pack<T>::n : 1);
  const int64_t max_blocks = int64_t(cuda_device_props(ctx.device.index).sm_count) * 8;
  float* s_out = scale.ptr<float>();
  if (mode == QuantMode::per_token) {
    if (a.rows == 0) return;
    const int block = int(std::min<int64_t>(256, std::max<int64_t>(32, (units + 31) / 32 * 32)));
    const int64_t scale_stride = scale.numel() > 1 ? scale.row_stride() : 1;
    launch_programmatic(ctx, "quant_fp8 per_token kernel launch", per_token_kernel<T, kVec>,
                        dim3(grid_for(a.rows, 1)), dim3(block), 0, a, s_out, scale_stride, scale_ub > 0,
                        float(scale_ub));
    return;
  }
  const Grid2 g = grid2(units, a.rows, max_blocks);
  const float* s_src = s_out;
  float* s_dst = nullptr;
  if (mode == QuantMode::per_tensor) {
    const int64_t parts = a.rows > 0 && units > 0 ? int64_t(g.grid.x) * g.grid.y : 0;
    float* partial = nullptr;
    if (parts > 0) {
      partial = static_cast<float*>(cuda_workspace(ctx, parts * int64_t(sizeof(float))));
      launch_programmatic(ctx, "quant_fp8 amax kernel launch", amax_partial_kernel<T, kVec>, g.grid, g.block, 0,
                          a, partial);
    }
    // parts 0: the minimum scale
    launch_programmatic(ctx, "quant_fp8 scale kernel launch", amax_finish_kernel, dim3(1), dim3(256), 0,
                        static_cast<const float*>(partial), parts, s_out);
  } else {
    s_src = static_scale.ptr<float>();
    s_dst = s_out;
  }
  // Static mode launches even without elements: its first thread copies the scale.
  if (a.rows == 0 || units == 0) {
    if (mode != QuantMode::static_scale) return;
  }
  launch_programmatic(ctx, "quant_fp8 quantize kernel launch", quant_kernel<T, kVec>, g.grid, g.block, 0, a, s_src,
                      s_dst);
}

void run(const Context& ctx, const TensorView& q, const TensorView& scale, const TensorView& x,
         const TensorView& static_scale, std::string_view mode, double scale_ub, bool vec) {
  const QuantMode m = parse_quant_mode(QuantFp8::name, mode);
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, QuantFp8::name, [&](auto tag) {
    using T = decltype(tag);
    Args<T> a{};
    a.x = x.ptr<T>(), a.x_stride = row_stride_of(x);
    a.q = q.ptr<uint8_t>(), a.q_stride = row_stride_of(q);
    a.rows = x.rows();
    a.hidden = x.size(-1);
    if (vec) launch<T, true>(ctx, a, m, scale, static_scale, scale_ub);
    else launch<T, false>(ctx, a, m, scale, static_scale, scale_ub);
  });
}

void run_coop(const Context& ctx, const TensorView& q, const TensorView& scale,
              const TensorView& x) {
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, QuantFp8::name, [&](auto tag) {
    using T = decltype(tag);
    FlatArgs<T> a{};
    a.x = x.ptr<T>();
    a.q = q.ptr<uint8_t>();
    a.n = x.numel();
    launch_per_tensor_coop<T>(ctx, a, scale.ptr<float>());
  });
}

}  // namespace
}  // namespace cuda::quant

void quant_fp8_cuda(const Context& ctx, const TensorView& q, const TensorView& scale,
                    const TensorView& x, const TensorView& static_scale, std::string_view mode,
                    double scale_ub) {
  cuda::quant::run(ctx, q, scale, x, static_scale, mode, scale_ub, false);
}
const char* quant_fp8_cuda_applicable(const TensorView&, const TensorView&, const TensorView& x,
                                      const TensorView&, std::string_view, double) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void quant_fp8_cuda_vec16(const Context& ctx, const TensorView& q, const TensorView& scale,
                          const TensorView& x, const TensorView& static_scale,
                          std::string_view mode, double scale_ub) {
  cuda::quant::run(ctx, q, scale, x, static_scale, mode, scale_ub, true);
}
const char* quant_fp8_cuda_vec16_applicable(const TensorView& q, const TensorView&,
                                            const TensorView& x, const TensorView&,
                                            std::string_view, double) {
  if (!cuda::is_cuda_float(x.dtype)) return cuda::kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();  // elements of a pack = bytes of q per pack
  if (const char* why = cuda::pack_rows_problem(x, x.size(-1))) return why;
  if ((reinterpret_cast<uintptr_t>(q.data) % uintptr_t(n)) != 0)
    return n == 8 ? "q is not 8-byte aligned" : "q is not 4-byte aligned";
  if (q.rows() > 1 && q.row_stride() % n != 0)
    return n == 8 ? "q row stride % 8 != 0" : "q row stride % 4 != 0";
  return nullptr;
}

void quant_fp8_cuda_vec16_coop(const Context& ctx, const TensorView& q, const TensorView& scale,
                               const TensorView& x, const TensorView&, std::string_view,
                               double) {
  cuda::quant::run_coop(ctx, q, scale, x);
}
const char* quant_fp8_cuda_vec16_coop_applicable(const TensorView& q, const TensorView&,
                                                 const TensorView& x, const TensorView&,
                                                 std::string_view mode, double) {
  if (!cuda::is_cuda_float(x.dtype)) return cuda::kNotCudaFloat;
  if (mode != "per_tensor") return "mode is not per_tensor";
  if (!x.is_contiguous()) return "x is not contiguous";
  if (!q.is_contiguous()) return "q is not contiguous";
  if (!cuda::aligned16(x.data)) return "x is not 16-byte aligned";
  const int64_t n = 16 / x.itemsize();  // elements of a pack = bytes of q per pack
  if ((reinterpret_cast<uintptr_t>(q.data) % uintptr_t(n)) != 0)
    return n == 8 ? "q is not 8-byte aligned" : "q is not 4-byte aligned";
  return nullptr;
}

void register_quant_cuda(Registry& reg) {
  reg.add_kernel<QuantFp8>(
      cuda_kernel_desc("cuda_vec16_coop", 300,
                       "per_tensor, contiguous: one cooperative launch, grid-wide amax of 16-byte "
                       "loads, grid barrier, quantize in reverse order (L2 hits), bit-exact",
                       false),
      &quant_fp8_cuda_vec16_coop, &quant_fp8_cuda_vec16_coop_applicable);
  KernelDesc vec = cuda_kernel_desc(
      "cuda_vec16", 200,
      "16-byte loads of x, 4/8-byte stores of q, hardware satfinite e4m3 conversion, scale kept "
      "on the device (bit-exact)",
      false);
  KernelDesc scalar = cuda_kernel_desc(
      "cuda", 100, "any layout: one element per thread-step, same arithmetic (bit-exact)", false);
  reg.add_kernel<QuantFp8>(std::move(vec), &quant_fp8_cuda_vec16, &quant_fp8_cuda_vec16_applicable);
  reg.add_kernel<QuantFp8>(std::move(scalar), &quant_fp8_cuda, &quant_fp8_cuda_applicable);
}

}  // namespace opforge
