// CPU kernels of dyt and dyt_backward: dyt_cpu, dyt_backward_cpu.
//
// Assumes: Note [row layout] (unit-stride rows, any uniform row stride), f32 / bf16 / f16 (f64
// goes to the reference), the op's check has run.
//
// Why it is fast:
// - Elementwise over each row with Highway's vector tanh (contrib/math, a few ulp in f32; the
//   bf16 / f16 forward a reduced one, tanh_for below), f32 math, runtime ISA dispatch; bf16 / f16 widened in registers and rounded once on the store
//   (Note [vector rounding]). gamma and beta are widened to f32 once per task. alpha is read
//   once per call.
// - Forward moves x + y bytes (plus gamma / beta once per task): the roofline minimum. Whether
//   it reaches the copy ceiling depends on the tanh's cost per element against the memory
//   bandwidth per core (see the measurements in the family's report).
// - OpenMP over tasks of rows from capacity_block (Note [tiling]). Backward: each chunk of rows
//   (whole tiles, at most cpu::kMaxPartialChunks: Note [bounded partials]; never per thread)
//   sums dgamma and dbeta into its own f32 partial rows and dalpha into its own f32 slot; the
//   chunks are added in chunk order in f64 (Note [ordered partials] in cpu.cpp: deterministic,
//   independent of the thread count).
// Tolerance: the backward kernels declare f32 atol = rtol = 1e-4 (layernorm.cpp,
// cpu_backward_desc): their parameter gradients are long sums of f32 terms.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/layernorm/cpu_dyt.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <memory>
#include <type_traits>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/activation/functors-inl.h"
#include "ops/layernorm/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::dyt_simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// src (n elements of T, or zeros when src is nullptr) widened into dst.
template <class T> void widen(const void* src, float* dst, int64_t n) {
  for_each_vector(n, [&](int64_t i, size_t count) {
    store_n(src ? load_n(static_cast<const T*>(src) + i, count) : hn::Zero(DF()), dst + i, count);
  });
}

// tanh(u) for the forward of outputs T. f32: Highway's Tanh. bf16 / f16 (Note [output
// precision], ops/activation/functors-inl.h): tanh |u| = -m / (2 + m) with m = expm1(-2 |u|) in
// (-1, 0] from the activations' reduced math (relative error below 1e-4 also near 0, where 1 - e
// would cancel) and the reciprocal estimate with one Newton step on [1, 2], the sign copied from
// u; about half the work of Tanh. The backward keeps Tanh: its 1 - t^2 needs t to the last bits
// where |u| is large.
template <class T> HWY_INLINE VF tanh_for(VF u) {
  namespace act = opforge::activation_cpu::HWY_NAMESPACE;
  if constexpr (std::is_same_v<T, float>) {
    return hn::Tanh(DF(), u);
  } else {
    using M = act::MathFor<T>;
    const VF na = act::neg_abs(u);
    const VF m = M::expm1(hn::Add(na, na));
    return hn::CopySign(hn::Mul(hn::Neg(m), M::recip(hn::Add(act::splat(2.0f), m))), u);
  }
}

template <class T> void forward_rows_typed(const DytRows& a, int64_t begin, int64_t end) {
  std::unique_ptr<float[]> gamma(new float[size_t(a.hidden)]), beta(new float[size_t(a.hidden)]);
  widen<T>(a.gamma, gamma.get(), a.hidden);
  widen<T>(a.beta, beta.get(), a.hidden);
  const DF d;
  const VF alpha = hn::Set(d, a.alpha);
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    T* y = static_cast<T*>(a.y) + row * a.y_stride;
    for_each_vector(a.hidden, [&](int64_t i, size_t count) {  // y may alias x: read, then write
      const VF t = tanh_for<T>(hn::Mul(alpha, load_n(x + i, count)));
      store_n(hn::MulAdd(load_n(gamma.get() + i, count), t, load_n(beta.get() + i, count)), y + i,
              count);
    });
  }
}

void dyt_forward_rows(const DytRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return forward_rows_typed<bf16_t>(a, begin, end);
    case DType::f16: return forward_rows_typed<f16_t>(a, begin, end);
    default: return forward_rows_typed<float>(a, begin, end);
  }
}

// Rows [begin, end): dx, and this chunk's partials dgamma_part, dbeta_part (hidden each) and
// *dalpha_part.
template <class T>
void backward_chunk_typed(const DytRows& a, int64_t begin, int64_t end, float* dgamma_part,
                          float* dbeta_part, float* dalpha_part) {
  std::fill(dgamma_part, dgamma_part + a.hidden, 0.0f);
  std::fill(dbeta_part, dbeta_part + a.hidden, 0.0f);
  std::unique_ptr<float[]> gamma(new float[size_t(std::max<int64_t>(a.hidden, 1))]);
  widen<T>(a.gamma, gamma.get(), a.hidden);
  const DF d;
  const VF alpha = hn::Set(d, a.alpha), one = hn::Set(d, 1.0f);
  // dalpha sums rows x hidden terms of both signs: each row's f32 lanes are added into a double,
  // so the f32 error is that of one row's sum (a whole chunk in f32 lanes missed the f32
  // tolerance at 48 x 1,024 on fresh inputs: check --fuzz).
  double dalpha_sum = 0;
  for (int64_t row = begin; row < end; ++row) {
    VF dalpha = hn::Zero(d);
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* dy = static_cast<const T*>(a.dy) + row * a.dy_stride;
    T* dx = static_cast<T*>(a.dx) + row * a.dx_stride;
    for_each_vector(a.hidden, [&](int64_t i, size_t count) {
      const VF v = load_n(x + i, count), up = load_n(dy + i, count);
      const VF t = hn::Tanh(d, hn::Mul(alpha, v));
      // s = gamma * (1 - t^2) * dy: the gradient of alpha * x. Tail lanes: up = 0, so s = 0.
      const VF s = hn::Mul(hn::Mul(load_n(gamma.get() + i, count), hn::NegMulAdd(t, t, one)), up);
      store_n(hn::Mul(alpha, s), dx + i, count);
      dalpha = hn::MulAdd(v, s, dalpha);
      store_n(hn::MulAdd(up, t, load_n(dgamma_part + i, count)), dgamma_part + i, count);
      store_n(hn::Add(up, load_n(dbeta_part + i, count)), dbeta_part + i, count);
    });
    dalpha_sum += double(sum_lanes(dalpha));
  }
  *dalpha_part = float(dalpha_sum);
}

void dyt_backward_chunk(const DytRows& a, int64_t begin, int64_t end, float* dgamma_part,
                        float* dbeta_part, float* dalpha_part) {
  switch (a.dtype) {
    case DType::bf16:
      return backward_chunk_typed<bf16_t>(a, begin, end, dgamma_part, dbeta_part, dalpha_part);
    case DType::f16:
      return backward_chunk_typed<f16_t>(a, begin, end, dgamma_part, dbeta_part, dalpha_part);
    default:
      return backward_chunk_typed<float>(a, begin, end, dgamma_part, dbeta_part, dalpha_part);
  }
}

}  // namespace opforge::dyt_simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace dyt_simd {
HWY_EXPORT(dyt_forward_rows);
HWY_EXPORT(dyt_backward_chunk);
}  // namespace dyt_simd

namespace {

// Rows per task (forward) or per chunk (backward): Note [tiling] over L2 with
// `tensors_per_element` row tensors of x's dtype touched at each element.
cpu::RowTasks row_tasks(const TensorView& x, int64_t tensors_per_element) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * x.itemsize();
  spec.multiplier = std::max<int64_t>(x.size(-1), 1);
  spec.level = cpu::CacheLevel::l2;
  return cpu::row_blocks(x.rows(), spec);
}

DytRows dyt_rows(const TensorView& x, const TensorView& alpha, const TensorView& gamma) {
  DytRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.alpha = float(load_as_double(alpha.data, alpha.dtype, 0));
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.gamma = gamma.data;
  return a;
}

}  // namespace

void dyt_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& alpha,
             const TensorView& gamma, const TensorView& beta) {
  DytRows a = dyt_rows(x, alpha, gamma);
  a.beta = beta.defined() ? beta.data : nullptr;
  a.y = y.data;
  a.y_stride = y.row_stride();
  const cpu::RowTasks tasks = cpu::balanced(row_tasks(x, 2));  // Note [balanced tasks]
  auto* rows_fn = HWY_DYNAMIC_DISPATCH(dyt_simd::dyt_forward_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { rows_fn(a, tasks.begin(t), tasks.end(t)); });
}

void dyt_backward_cpu(const Context&, const TensorView& dx, const TensorView& dalpha,
                      const TensorView& dgamma, const TensorView& dbeta, const TensorView& dy,
                      const TensorView& x, const TensorView& alpha, const TensorView& gamma) {
  DytRows a = dyt_rows(x, alpha, gamma);
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  const cpu::RowTasks chunks = cpu::partial_chunks(row_tasks(x, 3));  // Note [bounded partials]
  const int64_t n_chunks = chunks.count(), hidden = a.hidden;
  const size_t part_len = size_t(std::max<int64_t>(n_chunks * hidden, 1));
  std::unique_ptr<float[]> dgamma_parts(new float[part_len]), dbeta_parts(new float[part_len]);
  std::unique_ptr<float[]> dalpha_parts(new float[size_t(std::max<int64_t>(n_chunks, 1))]);
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(dyt_simd::dyt_backward_chunk);
  cpu::parallel_tasks(n_chunks, [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), dgamma_parts.get() + c * hidden,
             dbeta_parts.get() + c * hidden, dalpha_parts.get() + c);
  });
  reduce_partials_in_order(dgamma_parts.get(), n_chunks, hidden, dgamma);
  reduce_partials_in_order(dbeta_parts.get(), n_chunks, hidden, dbeta);
  reduce_partials_in_order(dalpha_parts.get(), n_chunks, 1, dalpha);
}

const char* dyt_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                               const TensorView&, const TensorView&) {
  return layernorm_cpu_reason(x);
}
const char* dyt_backward_cpu_applicable(const TensorView&, const TensorView&, const TensorView&,
                                        const TensorView&, const TensorView&, const TensorView& x,
                                        const TensorView&, const TensorView&) {
  return layernorm_cpu_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
