// CUDA kernels of the gated activations other than silu_and_mul (cuda.cu): gelu_and_mul (erf and
// tanh forms), mul_and_silu and fatrelu_and_mul, forward and backward.
//
// Math (the ops' docs), with a = x[..., :d], b = x[..., d:]:
//   gelu_and_mul "none": y = gelu(a) b, gelu(a) = a Phi(a) = a (1 + erf(a / sqrt 2)) / 2;
//     gelu'(a) = Phi(a) + a phi(a), phi(a) = e^(-a^2/2) / sqrt(2 pi).
//   gelu_and_mul "tanh": gelu(a) = a (1 + t) / 2, t = tanh(c (a + 0.044715 a^3)), c = sqrt(2/pi);
//     gelu'(a) = (1 + t) / 2 + a (1 - t^2) c (1 + 3 * 0.044715 a^2) / 2.
//   mul_and_silu: y = a silu(b); fatrelu_and_mul: y = (a > threshold ? a : 0) b.
//   Backward: dx[..., :d] = dy * d y / d a, dx[..., d:] = dy * d y / d b.
// Each functor (Gate below) gives y and (dy/da, dy/db) in f32; every output is rounded once. The
// tanh form and mul_and_silu take their sigmoid from act::sigmoid_both (Note [activation math,
// cuda]; 0.5 (1 + tanh(u)) = sigmoid(2u)): accurate expf and division for f32 data, exp2_ftz and
// rcp_ftz for f16 / bf16 data (`fast`, set by run()), whose ~2^-22 relative errors sit far under
// the result's spacing. The erf form keeps erff for f32 data and takes a rational approximation
// of Phi for 16-bit data (phi_fast below).
//
// Technique (as cuda.cu's silu_and_mul, one template over the functor): purely elementwise and
// memory-bound, each element of x read once, each output written once.
//  - cuda_vec16 (priority 200): 16-byte packs (8 bf16/f16 or 4 f32): one LDG.128 of a, one of b
//    (and of dy), one STG.128 per output. The predicate checks the alignment of every base and
//    that d and the row strides are multiples of the pack (so b = a + d stays aligned), and says
//    which fails; such layouts take the scalar kernel.
//  - cuda (priority 100): the same walk over single elements: any layout the check accepts.
//  Launch shape: 2-D blocks of 256 threads, x over column units of a row (up to 256, a power of
//  two), y over rows, so short rows still fill a block; grid y capped at 65535 with a row stride
//  loop. Compiled for 8 such blocks an SM (32 registers a thread) in the forward and in the erf
//  form's backward (Note [gated occupancy]). int64 offsets (row * row_stride), so 2^31 elements
//  and more index correctly. One launch on the Context's stream, no host synchronization, no
//  allocation, programmatic (Note [programmatic launch] in cuda_launch.cuh).
// Aliasing: each thread reads all its inputs before writing its outputs at the same columns, so
// dx may alias x exactly.
#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/activation/activation_cuda.h"
#include "ops/activation/functors_cuda.cuh"

namespace opforge {
namespace cuda::gated {
namespace {

// ---- the gates -----------------------------------------------------------------------------------
// Phi(a) = (1 + erf(a / sqrt 2)) / 2 through erff: about half the instructions of erfcf, which kept
// the bf16 kernel compute-bound (69% of the copy bandwidth at 16384 x 14336 on an H200, against
// 100% for the tanh form). In the far left tail 1 + erf cancels, but there a Phi(a) is below
// 1e-7 |a|, far inside every tolerance.
// For f16 / bf16 data (`fast`) erff alone still held the forward at 85% of copy, behind
// torch.compile, so Phi comes from the rational form of Abramowitz & Stegun 7.1.26:
// erfc(x) ~ t (p1 + t (p2 + t (p3 + t (p4 + t p5)))) e^(-x^2), t = 1 / (1 + p x), x = |a| / sqrt 2,
// absolute error below 1.5e-7 (below 7.5e-8 in Phi, the size of erff's own rounding in the left
// tail above), with exp2_ftz and rcp_ftz (Note [element exp]; __expf costs a range test and two
// multiplies more: bf16 1,024 / 16,384 x 14,336 on an H200 23.19 -> 21.48 / 349.2 -> 319.1
// us, 90.8% -> 98.0% / 96.5% -> 105.6% of copy, docs/perf/gpu-h200-2026-12-03-round41.md); a
// result's spacing is 2^-8 (bf16) or 2^-11 (f16) of it. e^(-x^2) = e^(-a^2 / 2) is also the
// density's exponential, so the backward shares it.
__device__ __forceinline__ float phi_fast(float a, float& gauss) {
  const float x = fabsf(a) * 0.70710678118654752f;
  const float t = rcp_ftz(fmaf(0.3275911f, x, 1.0f));
  gauss = exp2_ftz(x * (x * -kLog2e));
  const float poly =
      t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
               0.254829592f);
  const float half_erfc = 0.5f * poly * gauss;
  return a >= 0.0f ? 1.0f - half_erfc : half_erfc;  // a NaN a gives NaN (half_erfc is NaN)
}

struct GeluErf {
  static constexpr int kBackwardMinBlocks = 8;  // Note [gated occupancy]
  bool fast = false;
  __device__ __forceinline__ float value(float a, float b) const {
    if (fast) {
      float gauss;
      return a * phi_fast(a, gauss) * b;
    }
    return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f)) * b;
  }
  __device__ __forceinline__ float2 grad(float a, float b, float g) const {
    float cdf, pdf;
    if (fast) {
      float gauss;
      cdf = phi_fast(a, gauss);
      pdf = 0.39894228040143268f * gauss;
    } else {
      cdf = 0.5f * (1.0f + erff(a * 0.70710678118654752f));
      pdf = 0.39894228040143268f * expf(-0.5f * a * a);
    }
    return make_float2(g * b * (cdf + a * pdf), g * a * cdf);
  }
};

// The activation of the gate from the pointwise functors (functors_cuda.cuh), times the up half.
struct GeluTanh {  // gelu(a) b, gelu(a) = a sigmoid(2u), u = c (a + 0.044715 a^3), c = sqrt(2 / pi)
  static constexpr int kBackwardMinBlocks = 6;  // Note [gated occupancy]
  bool fast = false;
  __device__ __forceinline__ float value(float a, float b) const { return act::GeluTanh{.fast = fast}.value(a) * b; }
  __device__ __forceinline__ float2 grad(float a, float b, float g) const {
    float gelu, slope;
    act::GeluTanh{.fast = fast}.value_slope(a, gelu, slope);
    return make_float2(g * b * slope, g * gelu);
  }
};

struct MulSilu {  // y = a * silu(b)
  bool fast = false;
  __device__ __forceinline__ float value(float a, float b) const { return a * act::ScaledSilu{.fast = fast}.value(b); }
  __device__ __forceinline__ float2 grad(float a, float b, float g) const {
    float silu, slope;
    act::ScaledSilu{.fast = fast}.value_slope(b, silu, slope);
    return make_float2(g * silu, g * a * slope);
  }
};

struct Fatrelu {
  float threshold;
  __device__ __forceinline__ float value(float a, float b) const { return (a > threshold ? a : 0.0f) * b; }
  __device__ __forceinline__ float2 grad(float a, float b, float g) const {
    const bool on = a > threshold;
    return make_float2(on ? g * b : 0.0f, on ? g * a : 0.0f);
  }
};

template <class G> concept HasFastFlag = requires(G g) { g.fast; };
template <class G> concept HasBackwardMinBlocks = requires { G::kBackwardMinBlocks; };
// Note [gated occupancy]: the kernel's second launch bound, blocks of 256 threads an SM that it is
// compiled to fit. A thread moves one pack of a row and the grid is many waves of such blocks, so
// what keeps the loads in flight is warps an SM: 8 blocks (2,048 threads, 32 registers a thread)
// fill the SM. Left to itself ptxas gave the forward kernels 38-56 registers (75% of the threads
// or fewer) and gelu_and_mul's erf form was held by that, not by memory: H200, bf16, 1,024 /
// 16,384 x 14,336, in one call: gelu_and_mul 27.3 / 404.7 -> 23.3 / 346.5 us (77% / 83% -> 91% /
// 98% of copy), mul_and_silu 22.9 / 344.3 -> 21.3 / 319.8 (92% / 98% -> 100% / 106%), fatrelu
// unchanged (docs/perf/gpu-h200-2026-12-02-round39.md). Every forward takes 8 (no spills in the
// 16-bit kernels; f32's vec tanh form spills 4 bytes). The backward keeps ptxas's choice except
// the erf form (80 registers at bf16; at 8 blocks no spills in 16 bits, 12 bytes in the f32
// scalar kernel): gelu_and_mul_backward 40.5 / 615 -> 36.3 / 542 us (87% / 91% -> 97% / 104%).
// The tanh form's backward takes 6 (36.30 / 549.9 -> 35.70 / 541.5 us; 8 measured slower, 37.9 at
// 1,024 tokens). mul_and_silu_backward measured slower at 8 (35.8 -> 37.8 us at 1,024 tokens, it
// spills) and the same at 4 and 6; fatrelu the same at 1, 4, 6 and 8.
template <class G, bool kBackward> constexpr int min_blocks() {
  if constexpr (!kBackward) return 8;
  else if constexpr (HasBackwardMinBlocks<G>) return G::kBackwardMinBlocks;
  else return 1;
}

// ---- the kernel ----------------------------------------------------------------------------------
template <class T> struct Args {
  T* out;         // y (forward) or dx (backward)
  const T* x;     // [rows, 2d]
  const T* grad;  // dy (backward only)
  int64_t out_stride, x_stride, grad_stride;
  int64_t rows, d;
};

template <class T, class G, bool kVec, bool kBackward>
__device__ __forceinline__ void unit(const Args<T>& p, const G& gate, int64_t row, int64_t col) {
  const T* xa = p.x + row * p.x_stride + col;
  const T* xb = xa + p.d;
  T* out = p.out + row * p.out_stride + col;
  if constexpr (kVec) {
    constexpr int N = Pack<T>::n;
    const Pack<T> a = load_pack(xa), b = load_pack(xb);
    if constexpr (kBackward) {
      const Pack<T> g = load_pack(p.grad + row * p.grad_stride + col);
      Pack<T> da, db;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float2 r = gate.grad(to_f32(a.v[j]), to_f32(b.v[j]), to_f32(g.v[j]));
        da.v[j] = from_f32<T>(r.x);
        db.v[j] = from_f32<T>(r.y);
      }
      store_pack(out, da);
      store_pack(out + p.d, db);
    } else {
      Pack<T> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_f32<T>(gate.value(to_f32(a.v[j]), to_f32(b.v[j])));
      store_pack(out, y);
    }
  } else if constexpr (kBackward) {
    const float2 r = gate.grad(to_f32(*xa), to_f32(*xb), to_f32(p.grad[row * p.grad_stride + col]));
    out[0] = from_f32<T>(r.x);
    out[p.d] = from_f32<T>(r.y);
  } else {
    out[0] = from_f32<T>(gate.value(to_f32(*xa), to_f32(*xb)));
  }
}

template <class T, class G, bool kVec, bool kBackward, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) gated_kernel(Args<T> p, G gate) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = p.d / width;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;  // no barriers below
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.rows; row += row_step)
    unit<T, G, kVec, kBackward>(p, gate, row, u * width);
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

template <bool kVec, bool kBackward, class G>
void run(const Context& ctx, const char* op, const G& gate, const TensorView& out,
         const TensorView* grad, const TensorView& x) {
  const int64_t d = x.size(-1) / 2;
  if (x.rows() == 0 || d == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    G g = gate;
    if constexpr (HasFastFlag<G>) g.fast = sizeof(T) == 2;
    Args<T> p{};
    p.out = out.ptr<T>(), p.out_stride = row_stride_of(out);
    p.x = x.ptr<T>(), p.x_stride = row_stride_of(x);
    if (grad) p.grad = grad->ptr<T>(), p.grad_stride = row_stride_of(*grad);
    p.rows = x.rows();
    p.d = d;
    const int64_t units = d / (kVec ? Pack<T>::n : 1);
    int bx = 1;
    while (bx < units && bx < 256) bx *= 2;
    const int by = 256 / bx;
    const int64_t grid_y = std::min<int64_t>((p.rows + by - 1) / by, 65535);
    const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(grid_y));
    constexpr int kMinBlocks = min_blocks<G, kBackward>();  // Note [gated occupancy]
    launch_programmatic(ctx, op, gated_kernel<T, G, kVec, kBackward, kMinBlocks>, grid, dim3(bx, by), 0, p,
                        g);
  });
}

// gelu_and_mul's two forms, chosen per call.
template <bool kVec, bool kBackward>
void run_gelu(const Context& ctx, std::string_view approximate, const TensorView& out,
              const TensorView* grad, const TensorView& x) {
  const char* op = kBackward ? "gelu_and_mul_backward kernel launch" : "gelu_and_mul kernel launch";
  if (approximate == "tanh") run<kVec, kBackward>(ctx, op, GeluTanh{}, out, grad, x);
  else run<kVec, kBackward>(ctx, op, GeluErf{}, out, grad, x);
}

const char* scalar_problem(const TensorView& x) { return is_cuda_float(x.dtype) ? nullptr : kNotCudaFloat; }

// dtype, d a multiple of the pack, every tensor's rows packable.
const char* vec16_problem(std::initializer_list<const TensorView*> views, const TensorView& x) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();
  if ((x.size(-1) / 2) % n != 0) return n == 8 ? "d % 8 != 0" : "d % 4 != 0";
  for (const TensorView* t : views)
    if (const char* why = pack_rows_problem(*t, t->size(-1))) return why;
  return nullptr;
}

// ---- entry points --------------------------------------------------------------------------------
using TV = TensorView;

template <bool kVec> void gelu_and_mul_k(const Context& ctx, const TV& y, const TV& x, std::string_view approx) {
  run_gelu<kVec, false>(ctx, approx, y, nullptr, x);
}
template <bool kVec>
void gelu_and_mul_backward_k(const Context& ctx, const TV& dx, const TV& dy, const TV& x,
                             std::string_view approx) {
  run_gelu<kVec, true>(ctx, approx, dx, &dy, x);
}
const char* gelu_and_mul_scalar_ok(const TV&, const TV& x, std::string_view) { return scalar_problem(x); }
const char* gelu_and_mul_vec_ok(const TV& y, const TV& x, std::string_view) {
  return vec16_problem({&y, &x}, x);
}
const char* gelu_and_mul_backward_scalar_ok(const TV&, const TV&, const TV& x, std::string_view) {
  return scalar_problem(x);
}
const char* gelu_and_mul_backward_vec_ok(const TV& dx, const TV& dy, const TV& x, std::string_view) {
  return vec16_problem({&dx, &dy, &x}, x);
}

template <bool kVec> void mul_and_silu_k(const Context& ctx, const TV& y, const TV& x) {
  run<kVec, false>(ctx, "mul_and_silu kernel launch", MulSilu{}, y, nullptr, x);
}
template <bool kVec> void mul_and_silu_backward_k(const Context& ctx, const TV& dx, const TV& dy, const TV& x) {
  run<kVec, true>(ctx, "mul_and_silu_backward kernel launch", MulSilu{}, dx, &dy, x);
}
const char* mul_and_silu_scalar_ok(const TV&, const TV& x) { return scalar_problem(x); }
const char* mul_and_silu_vec_ok(const TV& y, const TV& x) { return vec16_problem({&y, &x}, x); }
const char* mul_and_silu_backward_scalar_ok(const TV&, const TV&, const TV& x) { return scalar_problem(x); }
const char* mul_and_silu_backward_vec_ok(const TV& dx, const TV& dy, const TV& x) {
  return vec16_problem({&dx, &dy, &x}, x);
}

template <bool kVec> void fatrelu_and_mul_k(const Context& ctx, const TV& y, const TV& x, double threshold) {
  run<kVec, false>(ctx, "fatrelu_and_mul kernel launch", Fatrelu{float(threshold)}, y, nullptr, x);
}
template <bool kVec>
void fatrelu_and_mul_backward_k(const Context& ctx, const TV& dx, const TV& dy, const TV& x,
                                double threshold) {
  run<kVec, true>(ctx, "fatrelu_and_mul_backward kernel launch", Fatrelu{float(threshold)}, dx, &dy, x);
}
const char* fatrelu_and_mul_scalar_ok(const TV&, const TV& x, double) { return scalar_problem(x); }
const char* fatrelu_and_mul_vec_ok(const TV& y, const TV& x, double) { return vec16_problem({&y, &x}, x); }
const char* fatrelu_and_mul_backward_scalar_ok(const TV&, const TV&, const TV& x, double) {
  return scalar_problem(x);
}
const char* fatrelu_and_mul_backward_vec_ok(const TV& dx, const TV& dy, const TV& x, double) {
  return vec16_problem({&dx, &dy, &x}, x);
}

}  // namespace
}  // namespace cuda::gated

void register_gated_activation_cuda(Registry& reg) {
  using namespace cuda::gated;
  const char* vec = "16-byte packs of a, b (and dy), f32 math, one rounding per output";
  const char* scalar = "any layout: one element per thread-step, f32 math";
  auto v = [&] { return cuda_kernel_desc("cuda_vec16", 200, vec, false); };
  auto s = [&] { return cuda_kernel_desc("cuda", 100, scalar, false); };
  reg.add_kernel<GeluAndMul>(v(), &gelu_and_mul_k<true>, &gelu_and_mul_vec_ok);
  reg.add_kernel<GeluAndMul>(s(), &gelu_and_mul_k<false>, &gelu_and_mul_scalar_ok);
  reg.add_kernel<GeluAndMulBackward>(v(), &gelu_and_mul_backward_k<true>, &gelu_and_mul_backward_vec_ok);
  reg.add_kernel<GeluAndMulBackward>(s(), &gelu_and_mul_backward_k<false>, &gelu_and_mul_backward_scalar_ok);
  reg.add_kernel<MulAndSilu>(v(), &mul_and_silu_k<true>, &mul_and_silu_vec_ok);
  reg.add_kernel<MulAndSilu>(s(), &mul_and_silu_k<false>, &mul_and_silu_scalar_ok);
  reg.add_kernel<MulAndSiluBackward>(v(), &mul_and_silu_backward_k<true>, &mul_and_silu_backward_vec_ok);
  reg.add_kernel<MulAndSiluBackward>(s(), &mul_and_silu_backward_k<false>, &mul_and_silu_backward_scalar_ok);
  reg.add_kernel<FatreluAndMul>(v(), &fatrelu_and_mul_k<true>, &fatrelu_and_mul_vec_ok);
  reg.add_kernel<FatreluAndMul>(s(), &fatrelu_and_mul_k<false>, &fatrelu_and_mul_scalar_ok);
  reg.add_kernel<FatreluAndMulBackward>(v(), &fatrelu_and_mul_backward_k<true>,
                                        &fatrelu_and_mul_backward_vec_ok);
  reg.add_kernel<FatreluAndMulBackward>(s(), &fatrelu_and_mul_backward_k<false>,
                                        &fatrelu_and_mul_backward_scalar_ok);
}

}  // namespace opforge
