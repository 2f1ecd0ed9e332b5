// CPU kernels of the activation family: silu_and_mul_cpu, silu_and_mul_backward_cpu.
//
// Assumes: Note [row layout] (ops/norm/norm.h) on x, y, dy, dx; f32 / bf16 / f16 (f64 goes to the
// reference kernel, the predicates say so); the op's check has run (y and dx overlap no input).
//
// Why it is fast:
// - One Highway source, runtime dispatch (4 f32 lanes on SSE4/NEON, 8 on AVX2, 16 on AVX-512);
//   a and b are read once, y (or dx) written once, all in registers as f32, rounded once on the
//   store (Note [vector rounding] in backends/cpu/simd-inl.h).
// - sigmoid(a) costs one vector exp, of -|a| so that it never overflows: s = 1 / (1 + e) for
//   a >= 0 and e / (1 + e) otherwise, e = exp(-|a|); the reciprocal is a hardware estimate and a
//   Newton step, not a divide (the divide unit was the bottleneck: silu is compute-bound per core).
// - OpenMP over tiles of a row block x column block; the tile holds capacity_block elements
//   (Note [tiling], L1: a tile's a, b and y slices fill half of a core's L1), so a single decode
//   token (1 x 14336) still spreads over the cores and large batches get thousands of tiles.
//
// Measured (16-vCPU Xeon VM, AVX-512 target, 16 threads): 1024 x 28672 f32 1.03 ms = 172 GB/s;
// bf16 1.19 ms = 74 GB/s, compute-bound (exp, reciprocal and the bf16 rounding: ~27 cycles per
// 16 lanes on one core).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/activation/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::activation_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// sigmoid(a) = 1 / (1 + exp(-a)), from e = exp(-|a|) in [0, 1]: 1 + e is in [1, 2], where the
// Newton-refined reciprocal is exact to an ulp or two and cheaper than a divide.
HWY_INLINE VF sigmoid(VF a) {
  const DF d;
  const VF e = hn::Exp(d, hn::Neg(hn::Abs(a)));
  const VF r = reciprocal(hn::Add(hn::Set(d, 1.0f), e));
  return hn::IfThenElse(hn::Lt(a, hn::Zero(d)), hn::Mul(e, r), r);
}

template <class T>
void forward_tile(const GatedRows& g, int64_t row_begin, int64_t row_end, int64_t col_begin,
                  int64_t col_end) {
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* a = static_cast<const T*>(g.x) + row * g.x_stride + col_begin;
    const T* b = a + g.d;
    T* y = static_cast<T*>(g.out) + row * g.out_stride + col_begin;
    for_each_vector(col_end - col_begin, [&](int64_t i, size_t count) {
      const VF va = load_n(a + i, count);
      store_n(hn::Mul(hn::Mul(va, sigmoid(va)), load_n(b + i, count)), y + i, count);
    });
  }
}

template <class T>
void backward_tile(const GatedRows& g, int64_t row_begin, int64_t row_end, int64_t col_begin,
                   int64_t col_end) {
  const DF d;
  const VF one = hn::Set(d, 1.0f);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* a = static_cast<const T*>(g.x) + row * g.x_stride + col_begin;
    const T* b = a + g.d;
    const T* dy = static_cast<const T*>(g.dy) + row * g.dy_stride + col_begin;
    T* da = static_cast<T*>(g.out) + row * g.out_stride + col_begin;
    T* db = da + g.d;
    for_each_vector(col_end - col_begin, [&](int64_t i, size_t count) {
      const VF va = load_n(a + i, count), vb = load_n(b + i, count), vg = load_n(dy + i, count);
      const VF s = sigmoid(va);
      const VF gs = hn::Mul(vg, s);
      // da = dy * b * s * (1 + a * (1 - s)), db = dy * a * s
      const VF slope = hn::MulAdd(va, hn::Sub(one, s), one);
      store_n(hn::Mul(hn::Mul(gs, vb), slope), da + i, count);
      store_n(hn::Mul(gs, va), db + i, count);
    });
  }
}

void silu_and_mul_tile(const GatedRows& g, int64_t row_begin, int64_t row_end, int64_t col_begin,
                       int64_t col_end) {
  switch (g.dtype) {
    case DType::bf16: return forward_tile<bf16_t>(g, row_begin, row_end, col_begin, col_end);
    case DType::f16: return forward_tile<f16_t>(g, row_begin, row_end, col_begin, col_end);
    default: return forward_tile<float>(g, row_begin, row_end, col_begin, col_end);
  }
}

void silu_and_mul_backward_tile(const GatedRows& g, int64_t row_begin, int64_t row_end,
                                int64_t col_begin, int64_t col_end) {
  switch (g.dtype) {
    case DType::bf16: return backward_tile<bf16_t>(g, row_begin, row_end, col_begin, col_end);
    case DType::f16: return backward_tile<f16_t>(g, row_begin, row_end, col_begin, col_end);
    default: return backward_tile<float>(g, row_begin, row_end, col_begin, col_end);
  }
}

}  // namespace opforge::activation_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace activation_cpu {
HWY_EXPORT(silu_and_mul_tile);
HWY_EXPORT(silu_and_mul_backward_tile);
}  // namespace activation_cpu

namespace {

// Tiles of rows x columns of the d gated columns, each about capacity_block elements.
struct GatedTiles {
  int64_t rows = 0, d = 0;
  int64_t rows_per_tile = 1, cols_per_tile = 1;

  int64_t col_tiles() const { return d > 0 ? cpu::ceil_div(d, cols_per_tile) : 0; }
  int64_t count() const {
    return rows > 0 ? cpu::ceil_div(rows, rows_per_tile) * col_tiles() : 0;
  }
};

// `tensors_per_element`: the element-sized slices one gated column touches (a, b, y: 3; the
// backward's a, b, dy, da, db: 5).
GatedTiles make_tiles(const TensorView& x, int64_t tensors_per_element) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * x.itemsize();
  spec.level = cpu::CacheLevel::l1d;
  const int64_t block = cpu::capacity_block(spec);
  GatedTiles t;
  t.rows = x.rows();
  t.d = x.size(-1) / 2;
  t.cols_per_tile = std::max<int64_t>(std::min(block, t.d), 1);
  t.rows_per_tile = std::max<int64_t>(block / std::max<int64_t>(t.d, 1), 1);
  return t;
}

template <class Fn> void run_tiles(const GatedTiles& t, const GatedRows& g, Fn* tile_fn) {
  const int64_t col_tiles = t.col_tiles();
  cpu::parallel_tasks(t.count(), [&](int64_t task) {
    const int64_t row_tile = task / col_tiles, col_tile = task % col_tiles;
    const int64_t row_begin = row_tile * t.rows_per_tile;
    const int64_t col_begin = col_tile * t.cols_per_tile;
    tile_fn(g, row_begin, std::min(t.rows, row_begin + t.rows_per_tile), col_begin,
            std::min(t.d, col_begin + t.cols_per_tile));
  });
}

const char* cpu_dtype_reason(const TensorView& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

}  // namespace

void silu_and_mul_cpu(const Context&, const TensorView& y, const TensorView& x) {
  GatedRows g;
  g.dtype = x.dtype;
  g.d = x.size(-1) / 2;
  g.x = x.data;
  g.x_stride = x.row_stride();
  g.out = y.data;
  g.out_stride = y.row_stride();
  run_tiles(make_tiles(x, 3), g, HWY_DYNAMIC_DISPATCH(activation_cpu::silu_and_mul_tile));
}

void silu_and_mul_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                               const TensorView& x) {
  GatedRows g;
  g.dtype = x.dtype;
  g.d = x.size(-1) / 2;
  g.x = x.data;
  g.x_stride = x.row_stride();
  g.dy = dy.data;
  g.dy_stride = dy.row_stride();
  g.out = dx.data;
  g.out_stride = dx.row_stride();
  run_tiles(make_tiles(x, 5), g, HWY_DYNAMIC_DISPATCH(activation_cpu::silu_and_mul_backward_tile));
}

const char* silu_and_mul_cpu_applicable(const TensorView&, const TensorView& x) {
  return cpu_dtype_reason(x);
}
const char* silu_and_mul_backward_cpu_applicable(const TensorView&, const TensorView&,
                                                 const TensorView& x) {
  return cpu_dtype_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
