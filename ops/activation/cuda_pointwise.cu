// CUDA kernels of the pointwise activations gelu_new, gelu_fast, quick_gelu, relu2, xielu and of
// the interleaved gated swigluoai_and_mul, forward and backward.
//
// Math: the ops' docs; the functors of functors_cuda.cuh (Note [activation math, cuda]) compute
// each value and derivative in f32 and every output is rounded once. Pointwise: y = f(x),
// dx = dy * f'(x). swigluoai_and_mul: x [..., 2d] holds (gate, up) pairs at columns (2i, 2i + 1),
// y [..., d]; its backward writes dx interleaved like x.
//
// Technique: purely elementwise and memory-bound; each input element is read once and each output
// written once. One kernel template over the functor serves every op (Layout below picks the
// pointwise or the interleaved walk).
//  - cuda_vec16 (priority 200): 16-byte packs (8 bf16/f16 or 4 f32 per LDG.128 / STG.128). A
//    pointwise unit is one pack of x (and of dy) and one pack of the output; a swigluoai unit is N
//    outputs: two packs of x (N pairs), one pack of y, or one pack of dy and two packs of dx. The
//    predicate checks every base for 16-byte alignment and that the row length (d for swigluoai)
//    and the row strides are multiples of the pack; other layouts take the scalar kernel.
//  - cuda (priority 100): the same walk over single elements (pairs), any layout the check accepts.
//  Registers: the 16-bit vec16 kernels of most functors are compiled for 6 or 8 blocks an SM
//  (Note [pointwise occupancy]).
//  Launch shape as the gated kernels (cuda_gated.cu): 2-D blocks of 256 threads, x over column
//  units of a row (up to 256, a power of two), y over rows, grid y capped at 65535 with a row
//  stride loop. int64 offsets (row * row_stride + column). One launch on ctx.stream, no host
//  synchronization, no allocation, programmatic (Note [programmatic launch] in cuda_launch.cuh).
//
// Aliasing: each thread reads all its inputs before it writes its outputs, at the same columns,
// so the pointwise in-place forms (y = x, dx = dy) are safe; swigluoai's outputs overlap no input
// (its check).
#include <algorithm>
#include <initializer_list>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/activation/activation_pointwise_cuda.h"
#include "ops/activation/functors_cuda.cuh"

namespace opforge {
namespace cuda::pointwise {
namespace {

enum class Layout { pointwise, interleaved };

template <class T> struct Args {
  T* out;         // y (forward) or dx (backward)
  const T* x;
  const T* grad;  // dy (backward only)
  int64_t out_stride, x_stride, grad_stride;
  int64_t rows;
  int64_t n;  // outputs of the forward per row: x.size(-1) (pointwise) or d (interleaved)
};

// One column unit (a pack of outputs, or one output) of one row, starting at forward output `col`.
template <class T, class F, Layout L, bool kVec, bool kBackward>
__device__ __forceinline__ void unit(const Args<T>& p, const F& f, int64_t row, int64_t col) {
  const T* x = p.x + row * p.x_stride;
  T* out = p.out + row * p.out_stride;
  const T* dy = kBackward ? p.grad + row * p.grad_stride : nullptr;
  if constexpr (L == Layout::pointwise) {
    if constexpr (kVec) {
      constexpr int N = Pack<T>::n;
      const Pack<T> xp = load_pack(x + col);
      Pack<T> o;
      if constexpr (kBackward) {
        const Pack<T> gp = load_pack(dy + col);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float v, slope;
          f.value_slope(to_f32(xp.v[j]), v, slope);
          o.v[j] = from_f32<T>(to_f32(gp.v[j]) * slope);
        }
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>(f.value(to_f32(xp.v[j])));
      }
      store_pack(out + col, o);
    } else if constexpr (kBackward) {
      float v, slope;
      f.value_slope(to_f32(x[col]), v, slope);
      out[col] = from_f32<T>(to_f32(dy[col]) * slope);
    } else {
      out[col] = from_f32<T>(f.value(to_f32(x[col])));
    }
  } else {  // interleaved (gate, up) pairs: pair i at x columns 2i, 2i + 1
    if constexpr (kVec) {
      constexpr int N = Pack<T>::n;
      const Pack<T> lo = load_pack(x + 2 * col), hi = load_pack(x + 2 * col + N);
      // Pair j of the unit: elements 2j, 2j + 1 of the 2N loaded (lo holds pairs 0 .. N/2 - 1).
      auto elem = [&](int e) { return e < N ? to_f32(lo.v[e]) : to_f32(hi.v[e - N]); };
      if constexpr (kBackward) {
        const Pack<T> gp = load_pack(dy + col);
        Pack<T> dlo, dhi;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float2 r = f.grad(elem(2 * j), elem(2 * j + 1), to_f32(gp.v[j]));
          if (2 * j < N) {
            dlo.v[2 * j] = from_f32<T>(r.x);
            dlo.v[2 * j + 1] = from_f32<T>(r.y);
          } else {
            dhi.v[2 * j - N] = from_f32<T>(r.x);
            dhi.v[2 * j + 1 - N] = from_f32<T>(r.y);
          }
        }
        store_pack(out + 2 * col, dlo);
        store_pack(out + 2 * col + N, dhi);
      } else {
        Pack<T> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>(f.value(elem(2 * j), elem(2 * j + 1)));
        store_pack(out + col, o);
      }
    } else if constexpr (kBackward) {
      const float2 r = f.grad(to_f32(x[2 * col]), to_f32(x[2 * col + 1]), to_f32(dy[col]));
      out[2 * col] = from_f32<T>(r.x);
      out[2 * col + 1] = from_f32<T>(r.y);
    } else {
      out[col] = from_f32<T>(f.value(to_f32(x[2 * col]), to_f32(x[2 * col + 1])));
    }
  }
}

// Note [two rows a thread]: the pointwise 16-byte kernel may take the same column unit of two rows
// (row and row + the grid's row step) a step, both rows' loads issued before any math, so a
// thread keeps twice the bytes in flight while the arithmetic of heavier functors (xielu, the
// GELUs) runs. Each thread still reads all its inputs before writing, at the same columns, so the
// in-place forms stay safe. H200, bf16, 1 against 2 rows a thread in one call, two repetitions
// (docs/perf/gpu-h200-2026-11-30-round28.md), 1,024 / 16,384 x 14,336: xielu 18.4 / 266.1 ->
// 17.8 / 255.1 us, quick_gelu 15.4 / 225.2 -> 14.6 / 221.3, relu2 14.8 / 220.3 -> 14.3 / 223.2;
// slower for gelu_new / gelu_fast (16.1 / 235.2 -> 17.5 / 254.0), the backwards and 16 rows (1.2 ->
// 1.4-1.6 us). So xielu, quick_gelu and relu2 opt in for their forward (kTwoRows) from 256 rows.
template <class T, class F, bool kBackward>
__device__ __forceinline__ void pointwise_two_rows(const Args<T>& p, const F& f, int64_t row, int64_t step,
                                                   int64_t col) {
  constexpr int N = Pack<T>::n;
  const int64_t rows[2] = {row, row + step};
  const bool has[2] = {true, row + step < p.rows};
  Pack<T> xp[2], gp[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (!has[k]) continue;
    xp[k] = load_pack(p.x + rows[k] * p.x_stride + col);
    if constexpr (kBackward) gp[k] = load_pack(p.grad + rows[k] * p.grad_stride + col);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (!has[k]) continue;
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if constexpr (kBackward) {
        float v, slope;
        f.value_slope(to_f32(xp[k].v[j]), v, slope);
        o.v[j] = from_f32<T>(to_f32(gp[k].v[j]) * slope);
      } else {
        o.v[j] = from_f32<T>(f.value(to_f32(xp[k].v[j])));
      }
    }
    store_pack(p.out + rows[k] * p.out_stride + col, o);
  }
}

template <class F> constexpr bool opts_in_two_rows() {
  if constexpr (requires { F::kTwoRows; }) return F::kTwoRows;
  else return false;
}

template <class T, class F, Layout L, bool kVec, bool kBackward, int kRows, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) pointwise_kernel(Args<T> p, F f) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = p.n / width;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;  // no barriers below
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  F g = f;  // the sigmoid functors take the intrinsics for 16-bit data (Note [activation math, cuda])
  if constexpr (requires { g.fast; }) g.fast = sizeof(T) == 2;
  if constexpr (kRows == 2) {
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.rows; row += 2 * row_step)
      pointwise_two_rows<T, F, kBackward>(p, g, row, row_step, u * width);
  } else {
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.rows; row += row_step)
      unit<T, F, L, kVec, kBackward>(p, g, row, u * width);
  }
}

// Note [pointwise occupancy]: the kernel's second launch bound, blocks of 256 threads an SM that
// it is compiled to fit, as the gated kernels' Note [gated occupancy] (cuda_gated.cu): a thread
// moves a pack or two of a row over a grid of many waves, so warps an SM are what keep loads in
// flight, and ptxas's own choice of registers held several functors under the copy rate. Chosen
// per functor and direction from 1, 6 and 8 blocks on an H200, then with against without in one
// call, bf16, 1,024 / 16,384 x 14,336, us (docs/perf/gpu-h200-2026-12-02-round40.md):
//   gelu_new, gelu_fast at 8: 16.96 -> 15.96 / 246.4 -> 235.1; backward at 8: 23.76 -> 22.58 /
//   356.0 -> 343.6; quick_gelu at 6: 16.05 -> 14.56 / 234.7 -> 220.4; xielu at 6: 19.23 ->
//   17.65 / 278.5 -> 258.7; swigluoai_and_mul at 8: 24.96 -> 22.40 / 365.0 -> 333.8, backward
//   at 6: 40.66 -> 39.03 / 617.8 -> 585.6 (f16 alike: gelu_new 16.78 -> 15.68).
// relu2 both ways and the backwards of quick_gelu and xielu measured the same or slower bounded
// (quick_gelu_backward 21.5 / 21.6 / 22.1 at 1 / 6 / 8), so they keep ptxas's choice, as do f32
// (half the elements a pack) and the scalar kernels.
template <class T, class F, bool kVec, bool kBackward> constexpr int min_blocks() {
  if constexpr (!kVec || sizeof(T) != 2) return 1;
  else if constexpr (std::is_base_of_v<act::GeluTanh, F>) return 8;  // gelu_new, gelu_fast
  else if constexpr (std::is_base_of_v<act::ScaledSilu, F> || std::is_same_v<F, act::Xielu>)
    return kBackward ? 1 : 6;  // quick_gelu, xielu
  else if constexpr (std::is_same_v<F, act::SwigluOai>) return kBackward ? 6 : 8;
  else return 1;
}

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

template <Layout L, bool kVec, bool kBackward, class F>
void run(const Context& ctx, const char* op, const F& f, const TensorView& out,
         const TensorView* grad, const TensorView& x) {
  const int64_t n = L == Layout::pointwise ? x.size(-1) : x.size(-1) / 2;
  if (x.rows() == 0 || n == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    Args<T> p{};
    p.out = out.ptr<T>(), p.out_stride = row_stride_of(out);
    p.x = x.ptr<T>(), p.x_stride = row_stride_of(x);
    if (grad) p.grad = grad->ptr<T>(), p.grad_stride = row_stride_of(*grad);
    p.rows = x.rows();
    p.n = n;
    const int64_t units = n / (kVec ? Pack<T>::n : 1);
    int bx = 1;
    while (bx < units && bx < 256) bx *= 2;
    const int by = 256 / bx;
    // Note [two rows a thread]: the forwards whose functor opts in (kTwoRows), from 256 rows on;
    // OPFORGE_CUDA_POINTWISE_ROWS=1 / 2 makes every pointwise kernel take 1 / 2 rows (tuning).
    static const int forced = env_choice("OPFORGE_CUDA_POINTWISE_ROWS", 1, 2);
    constexpr int kMinBlocks = min_blocks<T, F, kVec, kBackward>();  // Note [pointwise occupancy]
    if constexpr (kVec && L == Layout::pointwise) {
      const bool two_rows = forced ? forced == 2 : !kBackward && opts_in_two_rows<F>() && p.rows >= 256;
      if (two_rows && p.rows >= 2 * by) {
        const int64_t grid_y = std::min<int64_t>((p.rows + 2 * by - 1) / (2 * by), 65535);
        const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(grid_y));
        launch_programmatic(ctx, op, pointwise_kernel<T, F, L, kVec, kBackward, 2, kMinBlocks>, grid, dim3(bx, by),
                            0, p, f);
        return;
      }
    }
    const int64_t grid_y = std::min<int64_t>((p.rows + by - 1) / by, 65535);
    const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(grid_y));
    launch_programmatic(ctx, op, pointwise_kernel<T, F, L, kVec, kBackward, 1, kMinBlocks>, grid, dim3(bx, by), 0,
                        p, f);
  });
}

// ---- predicates ----------------------------------------------------------------------------------
const char* scalar_problem(const TensorView& x) {
  return is_cuda_float(x.dtype) ? nullptr : kNotCudaFloat;
}

// dtype, `n` (the row length, or d) a multiple of the pack, every tensor's rows packable.
const char* vec16_problem(std::initializer_list<const TensorView*> views, const TensorView& x,
                          int64_t n, const char* not_multiple_8, const char* not_multiple_4) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t pack = 16 / x.itemsize();
  if (n % pack != 0) return pack == 8 ? not_multiple_8 : not_multiple_4;
  for (const TensorView* t : views)
    if (const char* why = pack_rows_problem(*t, t->size(-1))) return why;
  return nullptr;
}
const char* pointwise_vec_problem(std::initializer_list<const TensorView*> views,
                                  const TensorView& x) {
  return vec16_problem(views, x, x.size(-1), "row length % 8 != 0", "row length % 4 != 0");
}
const char* interleaved_vec_problem(std::initializer_list<const TensorView*> views,
                                    const TensorView& x) {
  return vec16_problem(views, x, x.size(-1) / 2, "d % 8 != 0", "d % 4 != 0");
}

// ---- entry points --------------------------------------------------------------------------------
using TV = TensorView;

// Pointwise ops without scalars: the functor is fixed per op.
template <class Op, class F, bool kVec> void fwd(const Context& ctx, const TV& y, const TV& x) {
  run<Layout::pointwise, kVec, false>(ctx, Op::name, F{}, y, nullptr, x);
}
template <class Op, class F, bool kVec>
void bwd(const Context& ctx, const TV& dx, const TV& dy, const TV& x) {
  run<Layout::pointwise, kVec, true>(ctx, Op::name, F{}, dx, &dy, x);
}
const char* fwd_scalar_ok(const TV&, const TV& x) { return scalar_problem(x); }
const char* fwd_vec_ok(const TV& y, const TV& x) { return pointwise_vec_problem({&y, &x}, x); }
const char* bwd_scalar_ok(const TV&, const TV&, const TV& x) { return scalar_problem(x); }
const char* bwd_vec_ok(const TV& dx, const TV& dy, const TV& x) {
  return pointwise_vec_problem({&dx, &dy, &x}, x);
}

struct GeluNewF : act::GeluTanh {
  GeluNewF() { c = 0.79788456080286535588f; }  // sqrt(2 / pi)
};
struct GeluFastF : act::GeluTanh {
  GeluFastF() { c = 0.7978845608f; }  // FastGELU's literal
};
struct QuickGeluF : act::ScaledSilu {
  static constexpr bool kTwoRows = true;  // Note [two rows a thread]
  QuickGeluF() { alpha = 1.702f; }
};

// xielu: the scalars as the op takes them.
act::Xielu xielu_of(double alpha_p, double alpha_n, double beta, double eps) {
  return act::Xielu{float(alpha_p), float(alpha_n), float(beta), float(eps)};
}
template <bool kVec>
void xielu_k(const Context& ctx, const TV& y, const TV& x, double ap, double an, double beta,
             double eps) {
  run<Layout::pointwise, kVec, false>(ctx, Xielu::name, xielu_of(ap, an, beta, eps), y, nullptr, x);
}
template <bool kVec>
void xielu_backward_k(const Context& ctx, const TV& dx, const TV& dy, const TV& x, double ap,
                      double an, double beta, double eps) {
  run<Layout::pointwise, kVec, true>(ctx, XieluBackward::name, xielu_of(ap, an, beta, eps), dx,
                                     &dy, x);
}
const char* xielu_scalar_ok(const TV&, const TV& x, double, double, double, double) {
  return scalar_problem(x);
}
const char* xielu_vec_ok(const TV& y, const TV& x, double, double, double, double) {
  return pointwise_vec_problem({&y, &x}, x);
}
const char* xielu_backward_scalar_ok(const TV&, const TV&, const TV& x, double, double, double,
                                     double) {
  return scalar_problem(x);
}
const char* xielu_backward_vec_ok(const TV& dx, const TV& dy, const TV& x, double, double, double,
                                  double) {
  return pointwise_vec_problem({&dx, &dy, &x}, x);
}

// swigluoai_and_mul
template <bool kVec>
void oai_k(const Context& ctx, const TV& y, const TV& x, double alpha, double limit) {
  run<Layout::interleaved, kVec, false>(ctx, SwigluoaiAndMul::name,
                                        act::SwigluOai{float(alpha), float(limit)}, y, nullptr, x);
}
template <bool kVec>
void oai_backward_k(const Context& ctx, const TV& dx, const TV& dy, const TV& x, double alpha,
                    double limit) {
  run<Layout::interleaved, kVec, true>(ctx, SwigluoaiAndMulBackward::name,
                                       act::SwigluOai{float(alpha), float(limit)}, dx, &dy, x);
}
const char* oai_scalar_ok(const TV&, const TV& x, double, double) { return scalar_problem(x); }
const char* oai_vec_ok(const TV& y, const TV& x, double, double) {
  return interleaved_vec_problem({&y, &x}, x);
}
const char* oai_backward_scalar_ok(const TV&, const TV&, const TV& x, double, double) {
  return scalar_problem(x);
}
const char* oai_backward_vec_ok(const TV& dx, const TV& dy, const TV& x, double, double) {
  return interleaved_vec_problem({&dx, &dy, &x}, x);
}

constexpr const char* kVecSummary = "16-byte packs, f32 math, one rounding per output";
constexpr const char* kScalarSummary = "any layout: one element per thread-step, f32 math";

// The two kernels of a pointwise op without scalars and of its backward (in place allowed).
template <class Op, class OpBackward, class F> void add_pointwise(Registry& reg) {
  reg.add_kernel<Op>(cuda_kernel_desc("cuda_vec16", 200, kVecSummary, true), &fwd<Op, F, true>,
                     &fwd_vec_ok);
  reg.add_kernel<Op>(cuda_kernel_desc("cuda", 100, kScalarSummary, true), &fwd<Op, F, false>,
                     &fwd_scalar_ok);
  reg.add_kernel<OpBackward>(cuda_kernel_desc("cuda_vec16", 200, kVecSummary, true),
                             &bwd<OpBackward, F, true>, &bwd_vec_ok);
  reg.add_kernel<OpBackward>(cuda_kernel_desc("cuda", 100, kScalarSummary, true),
                             &bwd<OpBackward, F, false>, &bwd_scalar_ok);
}

}  // namespace
}  // namespace cuda::pointwise

void register_activation_pointwise_cuda(Registry& reg) {
  using namespace cuda::pointwise;
  add_pointwise<GeluNew, GeluNewBackward, GeluNewF>(reg);
  add_pointwise<GeluFast, GeluFastBackward, GeluFastF>(reg);
  add_pointwise<QuickGelu, QuickGeluBackward, QuickGeluF>(reg);
  add_pointwise<Relu2, Relu2Backward, cuda::act::Relu2>(reg);
  reg.add_kernel<Xielu>(cuda_kernel_desc("cuda_vec16", 200, kVecSummary, true), &xielu_k<true>,
                        &xielu_vec_ok);
  reg.add_kernel<Xielu>(cuda_kernel_desc("cuda", 100, kScalarSummary, true), &xielu_k<false>,
                        &xielu_scalar_ok);
  reg.add_kernel<XieluBackward>(cuda_kernel_desc("cuda_vec16", 200, kVecSummary, true),
                                &xielu_backward_k<true>, &xielu_backward_vec_ok);
  reg.add_kernel<XieluBackward>(cuda_kernel_desc("cuda", 100, kScalarSummary, true),
                                &xielu_backward_k<false>, &xielu_backward_scalar_ok);
  const char* oai_vec = "16-byte packs of (gate, up) pairs (and dy), f32 math, one rounding";
  reg.add_kernel<SwigluoaiAndMul>(cuda_kernel_desc("cuda_vec16", 200, oai_vec, false), &oai_k<true>,
                                  &oai_vec_ok);
  reg.add_kernel<SwigluoaiAndMul>(cuda_kernel_desc("cuda", 100, kScalarSummary, false),
                                  &oai_k<false>, &oai_scalar_ok);
  reg.add_kernel<SwigluoaiAndMulBackward>(cuda_kernel_desc("cuda_vec16", 200, oai_vec, false),
                                          &oai_backward_k<true>, &oai_backward_vec_ok);
  reg.add_kernel<SwigluoaiAndMulBackward>(cuda_kernel_desc("cuda", 100, kScalarSummary, false),
                                          &oai_backward_k<false>, &oai_backward_scalar_ok);
}

}  // namespace opforge
