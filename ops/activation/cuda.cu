// CUDA kernels of the activation family: silu_and_mul and silu_and_mul_backward.
//
// Math (the ops' docs): a = x[..., :d], b = x[..., d:], s = sigmoid(a) = 1 / (1 + e^-a);
// y = a / (1 + e^-a) * b; dx[..., :d] = dy * b * s * (1 + a * (1 - s)), dx[..., d:] = dy * a * s.
// Computed in f32, rounded once per output. s comes from act::ScaledSilu (Note [activation math,
// cuda]): accurate expf and division for f32 data; ex2.approx.ftz and rcp.approx.ftz for f16 / bf16
// data (the forward's s one-sided, Note [forward sigmoid]), whose relative errors (about 2^-22)
// sit far under the result's spacing (2^-11, 2^-8) and which keep the
// 16-bit kernels bound by memory rather than by the ~40 instructions an element of the accurate
// forms (the fused multiply of d elements per row leaves about 7 flops a byte at most).
//
// Technique. Purely elementwise and memory-bound: each element of x is read once and each output
// written once (forward 3 * rows * d elements moved, backward 5 * rows * d).
//  - cuda_vec16 (priority 200): each thread moves 16-byte packs (8 bf16/f16 or 4 f32): one LDG.128
//    of a, one of b (and of dy), one STG.128 per output. Needs 16-byte aligned bases, d and the row
//    strides multiples of the pack (so b = a + d stays aligned); the predicate says which fails.
//  - cuda (priority 100): the same walk over single elements, for any layout the check accepts.
//  Launch shape: 2-D blocks of 256 threads, x over column units of a row (up to 256, a power of
//  two), y over rows, so short rows still fill a block; the grid's y is capped at 65535 and the
//  kernel strides over the remaining rows. int64 row offsets (row * row_stride), so 2^31 elements
//  and more index correctly. One launch on ctx.stream, no host synchronization, no allocation,
//  programmatic (Note [programmatic launch] in cuda_launch.cuh).
//
// Aliasing: each thread reads all of its inputs before writing its outputs, at the same columns,
// so dx may alias x exactly in the backward kernels.
#include <algorithm>
#include <initializer_list>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/activation/activation_cuda.h"
#include "ops/activation/functors_cuda.cuh"

namespace opforge {
namespace cuda::activation {
namespace {

template <class T> struct Args {
  T* out;         // y (forward) or dx (backward)
  const T* x;     // [rows, 2d]
  const T* grad;  // dy (backward only)
  int64_t out_stride, x_stride, grad_stride;
  int64_t rows, d;
};

// The fast intrinsics for 16-bit data only (see the header).
template <class T> inline constexpr bool kFastMath = sizeof(T) == 2;

// silu(a) b and its (d a, d b), from the pointwise functor (functors_cuda.cuh).
template <class T> __device__ __forceinline__ float silu_mul(float a, float b) {
  return act::ScaledSilu{.fast = kFastMath<T>}.value(a) * b;
}

template <class T> __device__ __forceinline__ float2 silu_mul_grad(float a, float b, float g) {
  float silu, slope;
  act::ScaledSilu{.fast = kFastMath<T>}.value_slope(a, silu, slope);
  return make_float2(g * b * slope, g * silu);
}

// One column unit (a pack of 16 bytes, or one element) of one row.
template <class T, bool kVec, bool kBackward>
__device__ __forceinline__ void unit(const Args<T>& p, int64_t row, int64_t col) {
  const T* xa = p.x + row * p.x_stride + col;
  const T* xb = xa + p.d;
  if constexpr (kVec) {
    constexpr int N = Pack<T>::n;
    const Pack<T> a = load_pack(xa), b = load_pack(xb);
    if constexpr (kBackward) {
      const Pack<T> g = load_pack(p.grad + row * p.grad_stride + col);
      Pack<T> da, db;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float2 r = silu_mul_grad<T>(to_f32(a.v[j]), to_f32(b.v[j]), to_f32(g.v[j]));
        da.v[j] = from_f32<T>(r.x);
        db.v[j] = from_f32<T>(r.y);
      }
      T* out = p.out + row * p.out_stride + col;
      store_pack(out, da);
      store_pack(out + p.d, db);
    } else {
      Pack<T> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_f32<T>(silu_mul<T>(to_f32(a.v[j]), to_f32(b.v[j])));
      store_pack(p.out + row * p.out_stride + col, y);
    }
  } else if constexpr (kBackward) {
    const float2 r = silu_mul_grad<T>(to_f32(*xa), to_f32(*xb), to_f32(p.grad[row * p.grad_stride + col]));
    T* out = p.out + row * p.out_stride + col;
    out[0] = from_f32<T>(r.x);
    out[p.d] = from_f32<T>(r.y);
  } else {
    p.out[row * p.out_stride + col] = from_f32<T>(silu_mul<T>(to_f32(*xa), to_f32(*xb)));
  }
}

template <class T, bool kVec, bool kBackward>
__global__ void __launch_bounds__(256) silu_and_mul_kernel(Args<T> p) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = p.d / width;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;  // no barriers below
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.rows; row += row_step)
    unit<T, kVec, kBackward>(p, row, u * width);
}

template <class T, bool kVec, bool kBackward> void launch(const Context& ctx, const Args<T>& p) {
  const int64_t units = p.d / (kVec ? Pack<T>::n : 1);
  int bx = 1;
  while (bx < units && bx < 256) bx *= 2;
  const int by = 256 / bx;
  const int64_t grid_y = std::min<int64_t>((p.rows + by - 1) / by, 65535);
  const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(grid_y));
  launch_programmatic(ctx, kBackward ? "silu_and_mul_backward kernel launch" : "silu_and_mul kernel launch",
                      silu_and_mul_kernel<T, kVec, kBackward>, grid, dim3(bx, by), 0, p);
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

template <bool kVec, bool kBackward>
void run(const Context& ctx, const TensorView& out, const TensorView* grad, const TensorView& x) {
  const int64_t d = x.size(-1) / 2;
  if (x.rows() == 0 || d == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, kBackward ? "silu_and_mul_backward" : "silu_and_mul", [&](auto tag) {
    using T = decltype(tag);
    Args<T> p{};
    p.out = out.ptr<T>(), p.out_stride = row_stride_of(out);
    p.x = x.ptr<T>(), p.x_stride = row_stride_of(x);
    if (grad) p.grad = grad->ptr<T>(), p.grad_stride = row_stride_of(*grad);
    p.rows = x.rows();
    p.d = d;
    launch<T, kVec, kBackward>(ctx, p);
  });
}

// Shared by the vec16 predicates: dtype, d a multiple of the pack, every tensor's rows packable.
const char* vec16_problem(std::initializer_list<const TensorView*> views, const TensorView& x) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();
  if ((x.size(-1) / 2) % n != 0) return n == 8 ? "d % 8 != 0" : "d % 4 != 0";
  for (const TensorView* t : views)
    if (const char* why = pack_rows_problem(*t, t->size(-1))) return why;
  return nullptr;
}

}  // namespace
}  // namespace cuda::activation

using cuda::activation::run;

void silu_and_mul_cuda(const Context& ctx, const TensorView& y, const TensorView& x) {
  run<false, false>(ctx, y, nullptr, x);
}
const char* silu_and_mul_cuda_applicable(const TensorView&, const TensorView& x) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void silu_and_mul_cuda_vec16(const Context& ctx, const TensorView& y, const TensorView& x) {
  run<true, false>(ctx, y, nullptr, x);
}
const char* silu_and_mul_cuda_vec16_applicable(const TensorView& y, const TensorView& x) {
  return cuda::activation::vec16_problem({&y, &x}, x);
}

void silu_and_mul_backward_cuda(const Context& ctx, const TensorView& dx, const TensorView& dy,
                                const TensorView& x) {
  run<false, true>(ctx, dx, &dy, x);
}
const char* silu_and_mul_backward_cuda_applicable(const TensorView&, const TensorView&,
                                                  const TensorView& x) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void silu_and_mul_backward_cuda_vec16(const Context& ctx, const TensorView& dx,
                                      const TensorView& dy, const TensorView& x) {
  run<true, true>(ctx, dx, &dy, x);
}
const char* silu_and_mul_backward_cuda_vec16_applicable(const TensorView& dx,
                                                        const TensorView& dy,
                                                        const TensorView& x) {
  return cuda::activation::vec16_problem({&dx, &dy, &x}, x);
}

void register_activation_cuda(Registry& reg) {
  const char* vec = "16-byte packs of a, b (and dy), f32 math, one rounding per output";
  const char* scalar = "any layout: one element per thread-step, f32 math";
  reg.add_kernel<SiluAndMul>(cuda_kernel_desc("cuda_vec16", 200, vec, false),
                             &silu_and_mul_cuda_vec16, &silu_and_mul_cuda_vec16_applicable);
  reg.add_kernel<SiluAndMul>(cuda_kernel_desc("cuda", 100, scalar, false), &silu_and_mul_cuda,
                             &silu_and_mul_cuda_applicable);
  reg.add_kernel<SiluAndMulBackward>(cuda_kernel_desc("cuda_vec16", 200, vec, false),
                                     &silu_and_mul_backward_cuda_vec16,
                                     &silu_and_mul_backward_cuda_vec16_applicable);
  reg.add_kernel<SiluAndMulBackward>(cuda_kernel_desc("cuda", 100, scalar, false),
                                     &silu_and_mul_backward_cuda,
                                     &silu_and_mul_backward_cuda_applicable);
  register_gated_activation_cuda(reg);
}

}  // namespace opforge
