// CPU kernels of the softmax family: softmax_cpu, log_softmax_cpu, sparsemax_cpu and their
// backward kernels.
//
// Assumes: Note [row layout] (ops/norm/norm.h), f32 / bf16 / f16 (f64 goes to the reference: the
// predicates say so), the op's check has run (outputs alias inputs only exactly).
//
// Why it is fast:
// - One Highway source, runtime ISA dispatch (4 f32 lanes on SSE4/NEON, 8 on AVX2, 16 on
//   AVX-512); bf16/f16 widened to f32 in registers, rounded once on the store.
// - Each row is read from memory once. softmax widens the row into an f32 scratch row (L2) block
//   by block (Note [online softmax blocks], ops/softmax/row_math-inl.h), storing exp(x - m_block)
//   as it goes; the output sweep multiplies each block by exp(m_block - m) / sum. One vector exp
//   per element, x read once, y written once, and in place is safe (x is fully read first).
//   log_softmax sums the same way and writes x - lse from the scratch row. sparsemax finds tau
//   on the scratch row by Michelot's fixed point (tau_0 = max - 1, tau <- (sum over {v > tau}
//   - 1) / |{v > tau}| until the support stops shrinking; typically 3-6 sweeps over L2).
// - Backward: one sweep for the row statistic (dot(dy, y), sum(dy), support mean), one fused
//   sweep for dx; the second reads dy and y back from L1/L2.
// - The output sweeps (softmax, log_softmax and their backwards) read only cache, so they
//   prefetch the next row's inputs and, past the cache share, write by streaming stores
//   (write_row, ops/softmax/row_math-inl.h; Notes [row prefetch], [streaming stores]).
// - OpenMP over tasks of rows sized by capacity_block (Note [tiling], L2); the block of the
//   online statistics by capacity_block over L1. One task runs without an OpenMP region.
//
// Measured (2026-11-26, 2-vCPU AMD EPYC VM, AVX2, CPU time of one thread; memcpy ~19 GB/s read +
// write): 1024 x 32000 bf16 softmax 69 ms (17x the reference; PyTorch 2.15 torch.softmax 121-130
// ms), log_softmax 70 ms (PyTorch 131-138 ms), sparsemax 66 ms (46x the sorting reference);
// backward: softmax 39 ms (5 GB/s, 26% of the copy rate), sparsemax 40 ms, log_softmax 90 ms (one
// exp per element). Compute-bound on this core (exp and the bf16 conversions), not memory-bound.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/softmax/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/softmax/internal.h"
#include "ops/softmax/row_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::softmax_simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

const auto kIdentity = [](VF v) { return v; };

template <bool kStream, class T>
void softmax_row(const T* x, T* y, int64_t n, int64_t block, float* scratch, float* block_max, const T* next_x) {
  OnlineMaxSum stats;
  for (int64_t b0 = 0, b = 0; b0 < n; b0 += block, ++b) {
    const int64_t len = std::min(block, n - b0);
    float* v = scratch + b0;
    if (!stats.raise_to(widen_max(x + b0, v, len, kIdentity))) {
      std::fill(v, v + len, 0.0f);  // an all -inf prefix: probabilities 0
      block_max[b] = kNegInf;
      continue;
    }
    block_max[b] = stats.max;
    stats.sum += sum_exp<true>(v, len, stats.max);
  }
  for (int64_t b0 = 0, b = 0; b0 < n; b0 += block, ++b) {
    const int64_t len = std::min(block, n - b0);
    const VF factor = hn::Set(DF(), float(std::exp(double(block_max[b]) - stats.max) / stats.sum));
    write_row<kStream>(y + b0, len, next_x ? next_x + b0 : nullptr, kNone<T>,
                       [&](int64_t i, size_t count) { return hn::Mul(load_n(scratch + b0 + i, count), factor); });
  }
}

template <bool kStream, class T>
void log_softmax_row(const T* x, T* y, int64_t n, int64_t block, float* scratch, const T* next_x) {
  OnlineMaxSum stats;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0);
    if (stats.raise_to(widen_max(x + b0, scratch + b0, len, kIdentity)))
      stats.sum += sum_exp<false>(scratch + b0, len, stats.max);
  }
  // (x - max) - log(sum): x - max is exact near the max (Sterbenz), where y is small and an f32
  // lse rounded at the scale of max would cost an ulp of max.
  const VF vmax = hn::Set(DF(), stats.max), log_sum = hn::Set(DF(), float(std::log(stats.sum)));
  write_row<kStream>(y, n, next_x, kNone<T>, [&](int64_t i, size_t count) {
    return hn::Sub(hn::Sub(load_n(scratch + i, count), vmax), log_sum);
  });
}

// Count and sum of the v[i] > tau.
HWY_INLINE std::pair<float, float> support_of(const float* v, int64_t n, float tau) {
  const DF d;
  const VF vt = hn::Set(d, tau), one = hn::Set(d, 1.0f);
  return sum_over2(n, [&](int64_t i, size_t count, VF& cnt, VF& sum) {
    const VF x = load_n(v + i, count);
    auto in = hn::Gt(x, vt);
    if (count != hn::Lanes(d)) in = hn::And(in, hn::FirstN(d, count));
    cnt = hn::Add(cnt, hn::IfThenElseZero(in, one));
    sum = hn::Add(sum, hn::IfThenElseZero(in, x));
  });
}

template <class T> void sparsemax_row(const T* x, T* y, int64_t n, float* scratch) {
  const float max = widen_max(x, scratch, n, kIdentity);
  // Michelot: from tau <= tau*, the support only shrinks and tau only grows; when the support
  // size repeats, tau is (sum of the support - 1) / k, the sorted formula's value.
  float tau = max - 1.0f;
  float k = -1;
  for (int iter = 0; iter < 64; ++iter) {
    const auto [cnt, sum] = support_of(scratch, n, tau);
    if (cnt == k || cnt == 0) break;
    k = cnt;
    tau = (sum - 1.0f) / cnt;
  }
  const VF vt = hn::Set(DF(), tau);
  for_each_vector(n, [&](int64_t i, size_t count) {
    store_n(hn::Max(hn::Sub(load_n(scratch + i, count), vt), hn::Zero(DF())), y + i, count);
  });
}

// next_dy / next_y: the next row's inputs, prefetched by the dx sweep (null: none).
template <bool kStream, class T>
void backward_row(SoftmaxKind kind, const T* dy, const T* y, T* dx, int64_t n, int64_t block, const T* next_dy,
                  const T* next_y) {
  const DF d;
  if (kind == SoftmaxKind::softmax) {
    const float dot = float(sum_blocks(n, block, [&](int64_t i, size_t count, VF& acc) {
      acc = hn::MulAdd(load_n(dy + i, count), load_n(y + i, count), acc);
    }));
    const VF vdot = hn::Set(d, dot);
    write_row<kStream>(dx, n, next_dy, next_y, [&](int64_t i, size_t count) {
      return hn::Mul(load_n(y + i, count), hn::Sub(load_n(dy + i, count), vdot));
    });
  } else if (kind == SoftmaxKind::log_softmax) {
    const float sum = float(sum_blocks(n, block, [&](int64_t i, size_t count, VF& acc) {
      acc = hn::Add(acc, load_n(dy + i, count));
    }));
    const VF vsum = hn::Set(d, sum);
    write_row<kStream>(dx, n, next_dy, next_y, [&](int64_t i, size_t count) {
      const VF p = exp_bounded(load_n(y + i, count));  // y = log p <= 0
      return hn::NegMulAdd(p, vsum, load_n(dy + i, count));
    });
  } else {
    const VF zero = hn::Zero(d), one = hn::Set(d, 1.0f);
    const auto [cnt, sum] = sum_blocks2(n, block, [&](int64_t i, size_t count, VF& c, VF& s) {
      const auto in = hn::Gt(load_n(y + i, count), zero);  // tail lanes load as 0: outside
      c = hn::Add(c, hn::IfThenElseZero(in, one));
      s = hn::Add(s, hn::IfThenElseZero(in, load_n(dy + i, count)));
    });
    const VF mean = hn::Set(d, cnt > 0 ? float(sum / cnt) : 0.0f);
    for_each_vector(n, [&](int64_t i, size_t count) {
      const auto in = hn::Gt(load_n(y + i, count), zero);
      store_n(hn::IfThenElseZero(in, hn::Sub(load_n(dy + i, count), mean)), dx + i, count);
    });
  }
}

template <bool kStream, class T> void rows_typed(const SoftmaxRows& a, int64_t begin, int64_t end) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  const int64_t n_blocks = a.block > 0 ? (a.n + a.block - 1) / a.block : 0;
  std::unique_ptr<float[]> scratch(new float[size_t(a.n + lanes)]);
  std::unique_ptr<float[]> block_max(new float[size_t(n_blocks + 1)]);
  for (int64_t row = begin; row < end; ++row) {
    const T* in = static_cast<const T*>(a.in) + row * a.in_stride;
    T* out = static_cast<T*>(a.out) + row * a.out_stride;
    const bool last = row + 1 >= a.rows;
    const T* next_in = last ? nullptr : in + a.in_stride;
    if (a.y) {
      const T* y = static_cast<const T*>(a.y) + row * a.y_stride;
      backward_row<kStream>(a.kind, in, y, out, a.n, a.block, next_in, last ? nullptr : y + a.y_stride);
      continue;
    }
    switch (a.kind) {
      case SoftmaxKind::softmax:
        softmax_row<kStream>(in, out, a.n, a.block, scratch.get(), block_max.get(), next_in);
        break;
      case SoftmaxKind::log_softmax: log_softmax_row<kStream>(in, out, a.n, a.block, scratch.get(), next_in); break;
      case SoftmaxKind::sparsemax: sparsemax_row(in, out, a.n, scratch.get()); break;
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <bool kStream> void rows_for(const SoftmaxRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return rows_typed<kStream, bf16_t>(a, begin, end);
    case DType::f16: return rows_typed<kStream, f16_t>(a, begin, end);
    default: return rows_typed<kStream, float>(a, begin, end);
  }
}

void softmax_rows(const SoftmaxRows& a, int64_t begin, int64_t end) {
  if (a.stream) rows_for<true>(a, begin, end);
  else rows_for<false>(a, begin, end);
}

}  // namespace opforge::softmax_simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace softmax_simd {
HWY_EXPORT(softmax_rows);
}  // namespace softmax_simd

namespace {

// Rows per task over L2 (the row's input, output and f32 scratch), block over L1 (the block's
// input and its f32 copy), Note [tiling].
void run(SoftmaxKind kind, const TensorView& out, const TensorView& in, const TensorView* y) {
  SoftmaxRows a;
  a.kind = kind;
  a.dtype = in.dtype;
  a.n = in.size(-1);
  a.in = in.data;
  a.in_stride = in.row_stride();
  a.out = out.data;
  a.out_stride = out.row_stride();
  if (y) {
    a.y = y->data;
    a.y_stride = y->row_stride();
  }
  a.rows = in.rows();
  // Past the cache share the output goes out by streaming stores (Note [streaming stores]);
  // sparsemax's sweeps keep plain stores.
  if (kind != SoftmaxKind::sparsemax) a.stream = cpu::stream_outputs((y ? 3 : 2) * bytes_of(in), {&out});
  cpu::TileSpec block;
  block.bytes_per_element = in.itemsize() + int64_t(sizeof(float));
  block.level = cpu::CacheLevel::l1d;
  a.block = std::max<int64_t>(cpu::capacity_block(block), 64);
  cpu::TileSpec rows;
  rows.bytes_per_element = (y ? 3 : 2) * in.itemsize() + int64_t(sizeof(float));
  rows.multiplier = std::max<int64_t>(a.n, 1);
  const cpu::RowTasks tasks = cpu::balanced(cpu::row_blocks(in.rows(), rows));  // Note [balanced tasks]
  auto* fn = HWY_DYNAMIC_DISPATCH(softmax_simd::softmax_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(a, tasks.begin(t), tasks.end(t)); });
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

void softmax_cpu(const Context&, const TensorView& y, const TensorView& x) {
  run(SoftmaxKind::softmax, y, x, nullptr);
}
void log_softmax_cpu(const Context&, const TensorView& y, const TensorView& x) {
  run(SoftmaxKind::log_softmax, y, x, nullptr);
}
void sparsemax_cpu(const Context&, const TensorView& y, const TensorView& x) {
  run(SoftmaxKind::sparsemax, y, x, nullptr);
}
void softmax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                          const TensorView& y) {
  run(SoftmaxKind::softmax, dx, dy, &y);
}
void log_softmax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                              const TensorView& y) {
  run(SoftmaxKind::log_softmax, dx, dy, &y);
}
void sparsemax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                            const TensorView& y) {
  run(SoftmaxKind::sparsemax, dx, dy, &y);
}

const char* softmax_forward_cpu_applicable(const TensorView&, const TensorView& x) {
  return cpu_dtype_reason(x);
}
const char* softmax_backward_cpu_applicable(const TensorView&, const TensorView&,
                                            const TensorView& y) {
  return cpu_dtype_reason(y);
}

}  // namespace opforge
#endif  // HWY_ONCE
