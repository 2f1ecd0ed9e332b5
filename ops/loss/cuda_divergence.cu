// CUDA kernels of kl_div, jsd, tvd and their backward ops (math: the ops' docs, ops/loss/loss.h).
//
// Assumes: [N, V] inputs with Note [row layout] rows (any uniform row stride), f32 / f16 / bf16
// (f64 goes to the reference), labels int64 [N] with any stride, the op's check has run.
//
// Technique. Every op here is memory-bound: an element loss of two inputs (a, b) = (y_pred,
// y_true), (input, target) or (p, q): a log (kl_div), an exp (kl_div with log targets), two exps
// and a log (jsd) or a compare (tvd) per element; the element math is ops/loss/pair_elements.cuh.
//  - Reduced forward (sum / mean / batchmean, and jsd): the threads of a row (a warp for short
//    rows, up to 256 for long ones; several rows per 256-thread block, as in ops/loss/cuda.cu)
//    read both rows once, add the element losses in f32 per thread, and reduce over the row in a
//    fixed order (row_sum, ops/softmax/row_reduce.cuh). With few rows, each row is cut into
//    segments (one group of threads each) so that the grid still fills the device. Rows whose
//    label is ignore_index are not read; their sums are 0. The segment sums go to the stream's
//    workspace (Note [cuda workspace]) and the launch's last block (Note [last block], found
//    through the stream's barrier word without waiting) adds them in f64 in a fixed order and
//    divides by the kept rows (times V for mean) counted on the device: Note [loss row
//    reduction] (ops/loss/loss_cuda.cuh). One launch in all.
//    No atomics, no host synchronization, deterministic.
//  - Element-wise forward (reduction none) and every backward: one streaming pass, no reduction:
//    2-D blocks, x over the row's units, y over rows (grid-stride over rows beyond 65535 blocks),
//    4 units a thread with their loads issued together where the launch stays large enough.
//    The upstream gradient is either element-wise (dloss [N, V], none) or one scalar dloss[0]
//    divided by the reduction's divisor; when that divisor counts kept rows (labels), a one-block
//    launch first counts them into the workspace. Ignored rows get 0.
//  - cuda_vec16 (priority 200): units are 16-byte packs (4 f32 or 8 f16 / bf16: one LDG.128 per
//    input); the predicate asks 16-byte aligned bases, V and row strides multiples of the pack for
//    every [N, V] tensor the kernel touches. cuda (priority 100): units are single elements,
//    coalesced across the threads of a row, any layout the check accepts (odd V, padded rows).
//  - cuda_vec16_fast (priority 300, kl_div and jsd reduced forward only): Note [unrolled pair
//    rows]: the vec16 decomposition with 16 elements of each input loaded before use and the log of
//    16-bit data on the special-function unit (Note [element log]); same predicate as cuda_vec16
//    plus a reduction other than none.
//  - All math in f32: accurate logf (except Note [element log]); exp per Note [element exp]
//    (expf for f32 data, one ex2.approx.ftz for 16-bit data). int64 offsets throughout
//    (row * row_stride + unit * width).
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <type_traits>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"
#include "ops/loss/pair_elements.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge {
namespace cuda::loss {
namespace {

using namespace cuda::rows;  // NOLINT: UnitOf, row_sum, exp_of

using namespace pair;  // NOLINT: the element math (ops/loss/pair_elements.cuh)

enum class PairRed { none, sum, mean, batchmean };
PairRed pair_red_of(std::string_view r) {
  return r == "none" ? PairRed::none : r == "sum" ? PairRed::sum : r == "mean" ? PairRed::mean : PairRed::batchmean;
}

__device__ __forceinline__ bool kept_row(const int64_t* labels, int64_t stride, int64_t row, int64_t ignore_index) {
  return labels == nullptr || labels[row * stride] != ignore_index;
}

template <class T> struct PairArgs {
  const T* a;  // null for the kl backward (not read)
  int64_t a_stride;
  const T* b;
  int64_t b_stride;
  int64_t rows, vocab;
  const int64_t* labels;  // null: every row kept
  int64_t labels_stride, ignore_index;
  PairParams o;
  // reduced forward
  float* row_sums;  // [rows x splits] segment sums, dense
  // element-wise forward / backward
  T* out;
  int64_t out_stride;
  const T* dloss;  // element-wise upstream gradient [N, V] (none), else null
  int64_t dloss_stride;
  const void* dloss_scalar;  // dloss[0] of a reduced loss (backward), else null
  DType dloss_dtype;
  const float* kept_count;  // device count of kept rows (labels and a divisor that counts them)
  double divisor;           // divisor without kept_count; with it, kept_count * divisor
};

// Reduced forward over segments: row r's units are split into `splits` segments of `seg_units`
// (the last one shorter); segment v = r * splits + seg is read by `rt` threads (a power of two,
// 32..256), blockDim.x / rt segments per block, and its sum goes to row_sums[v].
template <class T, bool kVec, Pair K>
__global__ void __launch_bounds__(256)
    pair_rows_kernel(PairArgs<T> p, int rt, int64_t splits, int64_t seg_units, RowReduce r, unsigned* arrivals) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  __shared__ float scratch[32];
  const int64_t units = p.vocab / W, segments = p.rows * splits;
  const int per_block = int(blockDim.x) / rt;
  const int64_t tid = int(threadIdx.x) % rt;
  const int64_t step = int64_t(gridDim.x) * per_block;
  // `base` is the same for every thread of the block, so all of them reach row_sum's barriers.
  for (int64_t base = int64_t(blockIdx.x) * per_block; base < segments; base += step) {
    const int64_t v = base + int(threadIdx.x) / rt;
    const bool live = v < segments;
    const int64_t row = live ? v / splits : 0;
    const int64_t begin = live ? (v % splits) * seg_units : 0, end = min(units, begin + seg_units);
    const bool kept = live && kept_row(p.labels, p.labels_stride, row, p.ignore_index);
    const T* a = p.a + row * p.a_stride;
    const T* b = p.b + row * p.b_stride;
    float s = 0.0f;
    for (int64_t u = begin + tid; kept && u < end; u += rt) {
      const typename U::Floats x = U::widen(U::load(a + u * W));
      const typename U::Floats y = U::widen(U::load(b + u * W));
#pragma unroll
      for (int j = 0; j < W; ++j) s += element_loss<T, K>(x.v[j], y.v[j], p.o);
    }
    s = row_sum(s, rt, scratch);
    if (live && tid == 0) p.row_sums[v] = s;
  }
  if (last_block_arrives(arrivals, gridDim.x)) reduce_rows_in_block<256>(r);
}

// Note [unrolled pair rows]: the reduced forward of cuda_vec16_fast (kl_div, jsd). The same
// (row, segment) decomposition and row-sum order per step as pair_rows_kernel, but each thread
// issues the 16-byte loads of pair_unroll<T>() packs of both inputs (16 elements of each: 2 packs
// of bf16 / f16, 4 of f32) before using any, so a warp keeps 2-4 KB in flight where
// pair_rows_kernel kept 1 KB, and the logs of 16-bit
// data run on the special-function unit (Note [element log]): with the accurate logf, jsd (two
// exps and a log per element) and kl_div issued about as many instructions as the memory system
// could feed and fell to 40-57% of the copy bandwidth. Per thread the unit order is fixed
// (u0, u0 + rt, ..., by step), so the sums are deterministic. At most 64 registers a thread, so
// four 256-thread blocks (64-128 KB of loads) share an SM; 16 elements of each input is what fits
// them without spilling (4 packs of bf16, 64 elements, spilled about 100 bytes a thread; with 80
// registers and three blocks an SM, 1.5x slower). Loading the next step's packs before using the
// current ones gained 2-4% for bf16 and lost 9% for f16 (H200, docs/perf/gpu-h200-2026-11-30-round33.md).
template <class T> constexpr int pair_unroll() { return 16 / Pack<T>::n; }

// Note [jsd beta at compile time]: jsd's kernel here is instantiated for beta 0, 1 and anything
// else (kB), so its element loop carries no per-element test of beta: with the test, the element
// issued 35 instructions (the beta-0 and beta-1 paths' exps too, predicated off, and their
// branches) for 3 exps and logs; 16-bit data also takes Note [jsd in log2 units].
template <class T, Pair K, Beta kB>
__global__ void __launch_bounds__(256, 4) pair_rows_unrolled_kernel(PairArgs<T> p, int rt, int64_t splits,
                                                                 int64_t seg_units, RowReduce r,
                                                                 unsigned* arrivals) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int N = Pack<T>::n;
  constexpr int U = pair_unroll<T>();
  __shared__ float scratch[32];
  const int64_t units = p.vocab / N, segments = p.rows * splits;
  const int per_block = int(blockDim.x) / rt;
  const int64_t tid = int(threadIdx.x) % rt;
  const int64_t step = int64_t(gridDim.x) * per_block;
  // `base` is the same for every thread of the block, so all of them reach row_sum's barriers.
  for (int64_t base = int64_t(blockIdx.x) * per_block; base < segments; base += step) {
    const int64_t v = base + int(threadIdx.x) / rt;
    const bool live = v < segments;
    const int64_t row = live ? v / splits : 0;
    const int64_t begin = live ? (v % splits) * seg_units : 0, end = min(units, begin + seg_units);
    const bool kept = live && kept_row(p.labels, p.labels_stride, row, p.ignore_index);
    const T* a = p.a + row * p.a_stride;
    const T* b = p.b + row * p.b_stride;
    constexpr bool kLog2Units = K == Pair::jsd && !std::is_same_v<T, float>;  // Note [jsd in log2 units]
    float s = 0.0f;
    for (int64_t u0 = begin + tid; kept && u0 < end; u0 += int64_t(U) * rt) {
      Pack<T> xa[U], xb[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t u = u0 + int64_t(k) * rt;
        if (u < end) {
          xa[k] = load_pack(a + u * N);
          xb[k] = load_pack(b + u * N);
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (u0 + int64_t(k) * rt < end) {
          // widen_pack: bf16 words by a shift and a mask, not an extraction of each half.
          const PackFloats<T> x = widen_pack(xa[k]), y = widen_pack(xb[k]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            if constexpr (kLog2Units)
              jsd_add_log2<kB>(x.v[j], y.v[j], p.o, s);
            else
              s += element_loss<T, K, true, kB>(x.v[j], y.v[j], p.o);
          }
        }
    }
    if constexpr (kLog2Units) s *= kLn2;
    s = row_sum(s, rt, scratch);
    if (live && tid == 0) p.row_sums[v] = s;
  }
  if (last_block_arrives(arrivals, gridDim.x)) reduce_rows_in_block<256>(r);
}

// Element-wise forward (none) or backward: x over units of a row, y over rows. A thread takes
// kUnits units of a row (u0, u0 + bx, ...; bx = blockDim.x), every load of them issued before the
// math, as cross_entropy_backward's Note [backward units] (ops/loss/cuda.cu): the row's label and
// the scalar gradient are read once for all of them, and the launch has a quarter of the blocks.
// kB: jsd's backward is instantiated per beta case (Note [jsd beta at compile time]).
template <class T, bool kVec, Pair K, bool kBackward, int kUnits, Beta kB = Beta::any>
__global__ void __launch_bounds__(256) pair_elements_kernel(PairArgs<T> p) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, kVec>;
  constexpr int W = U::width;
  constexpr bool kReadA = !kBackward || reads_a_in_backward<K>;
  const int64_t units = p.vocab / W;
  const int64_t u0 = int64_t(blockIdx.x) * blockDim.x * kUnits + threadIdx.x;
  if (u0 >= units) return;  // no barriers below
  float g = 1.0f;           // the scalar upstream gradient of a reduced loss
  if (kBackward && p.dloss == nullptr) {
    const double divisor = p.kept_count ? double(*p.kept_count) * p.divisor : p.divisor;
    g = float(double(load_float(p.dloss_scalar, p.dloss_dtype, 0)) / divisor);
  }
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.rows; row += row_step) {
    T* out = p.out + row * p.out_stride;
    if (!kept_row(p.labels, p.labels_stride, row, p.ignore_index)) {
      typename U::Floats d;
#pragma unroll
      for (int j = 0; j < W; ++j) d.v[j] = 0.0f;
#pragma unroll
      for (int k = 0; k < kUnits; ++k)
        if (const int64_t u = u0 + int64_t(k) * blockDim.x; u < units) U::store(out + u * W, d);
      continue;
    }
    typename U::Raw rb[kUnits], ra[kReadA ? kUnits : 1], rg[kBackward ? kUnits : 1];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int64_t u = u0 + int64_t(k) * blockDim.x;
      if (u >= units) break;
      rb[k] = U::load(p.b + row * p.b_stride + u * W);
      if constexpr (kReadA) ra[k] = U::load(p.a + row * p.a_stride + u * W);
      if constexpr (kBackward) {
        if (p.dloss != nullptr) rg[k] = U::load(p.dloss + row * p.dloss_stride + u * W);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int64_t u = u0 + int64_t(k) * blockDim.x;
      if (u >= units) break;
      const typename U::Floats y = U::widen(rb[k]);
      typename U::Floats x, d;
      if constexpr (kReadA) {
        x = U::widen(ra[k]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) x.v[j] = 0.0f;
      }
      if constexpr (kBackward) {
        typename U::Floats ge;
        if (p.dloss != nullptr) {
          ge = U::widen(rg[k]);
        } else {
#pragma unroll
          for (int j = 0; j < W; ++j) ge.v[j] = g;
        }
#pragma unroll
        for (int j = 0; j < W; ++j) d.v[j] = ge.v[j] * element_grad<T, K, kB>(x.v[j], y.v[j], p.o);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) d.v[j] = element_loss<T, K>(x.v[j], y.v[j], p.o);
      }
      U::store(out + u * W, d);
    }
  }
}

// ---- launches ------------------------------------------------------------------------------------

// What a call of one op asks: tensors as views, the reduction, and which divisor it uses.
struct PairCall {
  const char* op;
  Pair kind;
  PairRed red;
  const TensorView* a;  // may be undefined (kl backward)
  const TensorView* b;
  const TensorView* labels;  // may be undefined
  int64_t ignore_index;
  PairParams o;
};

template <class T> PairArgs<T> args_of(const PairCall& c) {
  PairArgs<T> p{};
  p.a = c.a->defined() ? c.a->ptr<T>() : nullptr, p.a_stride = c.a->defined() ? row_stride_of(*c.a) : 0;
  p.b = c.b->ptr<T>(), p.b_stride = row_stride_of(*c.b);
  p.rows = c.b->size(0), p.vocab = c.b->size(1);
  p.labels = c.labels->defined() ? c.labels->ptr<int64_t>() : nullptr;
  p.labels_stride = c.labels->defined() ? stride0(*c.labels) : 0;
  p.ignore_index = c.ignore_index;
  p.o = c.o;
  return p;
}

// Calls f(std::integral_constant-like tag) for the op's kind as a template argument.
template <class F> void dispatch_pair(Pair kind, F&& f) {
  switch (kind) {
    case Pair::kl: f(std::integral_constant<Pair, Pair::kl>{}); return;
    case Pair::kl_log: f(std::integral_constant<Pair, Pair::kl_log>{}); return;
    case Pair::jsd: f(std::integral_constant<Pair, Pair::jsd>{}); return;
    default: f(std::integral_constant<Pair, Pair::tvd>{}); return;
  }
}

// The row-divisor multiplier of a reduction: mean divides by rows x V, batchmean (and jsd) by rows.
double vocab_factor(PairRed red, int64_t vocab) { return red == PairRed::mean ? double(vocab) : 1.0; }

template <bool kVec> void launch_elements(const Context& ctx, const PairCall& c, bool backward, const TensorView& out,
                                          const TensorView& dloss, const float* kept_count, double divisor) {
  const int64_t rows = c.b->size(0), vocab = c.b->size(1);
  dispatch_float(c.b->dtype, c.op, [&](auto tag) {
    using T = decltype(tag);
    PairArgs<T> p = args_of<T>(c);
    p.out = out.ptr<T>(), p.out_stride = row_stride_of(out);
    if (backward && c.red == PairRed::none) {
      p.dloss = dloss.ptr<T>(), p.dloss_stride = row_stride_of(dloss);
    } else if (backward) {
      p.dloss_scalar = dloss.data, p.dloss_dtype = dloss.dtype;
      p.kept_count = kept_count, p.divisor = divisor;
    }
    const int64_t units = vocab / UnitOf<T, kVec>::width;
    if (rows == 0 || units == 0) return;
    // 4 units a thread (16-byte packs) where that still leaves the launch 8 blocks an SM, except
    // for tvd, whose element is one compare; else 1. H200, bf16, us at 1 / 4 units: jsd_backward
    // 1,024 x 32,000 78.3 / 71.9, 256 x 128,256 77.9 / 71.7, but 16 x 128,256 (256 blocks) 6.08 /
    // 8.50; kl_div_backward 34.3 / 33.4 and 34.2 / 33.5; tvd_backward already at the copy rate
    // with 1 (46.6 / 47.3; docs/perf/gpu-h200-2026-11-29-round27.md). OPFORGE_CUDA_PAIR_UNITS=1
    // or 4 fixes it (tuning).
    static const int forced = env_choice("OPFORGE_CUDA_PAIR_UNITS", 1, 4);
    const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
    const bool four = kVec && (forced ? forced == 4
                                      : c.kind != Pair::tvd && rows * ((units + 1023) / 1024) >= 8 * sms);
    const ElementLaunch shape = element_launch(units, rows, four ? 4 : 1);
    dispatch_pair(c.kind, [&](auto kind) {
      constexpr Pair K = decltype(kind)::value;
      auto launch = [&](auto kernel) { launch_programmatic(ctx, c.op, kernel, shape.grid, shape.block, 0, p); };
      // jsd's backward per beta case (Note [jsd beta at compile time]); its forward is reduced.
      auto launch_backward = [&](auto units) {
        constexpr int kU = decltype(units)::value;
        if constexpr (K == Pair::jsd) {
          if (c.o.beta_zero) return launch(pair_elements_kernel<T, kVec, K, true, kU, Beta::zero>);
          if (c.o.beta_one) return launch(pair_elements_kernel<T, kVec, K, true, kU, Beta::one>);
          return launch(pair_elements_kernel<T, kVec, K, true, kU, Beta::mixed>);
        } else {
          return launch(pair_elements_kernel<T, kVec, K, true, kU>);
        }
      };
      if constexpr (kVec) {
        if (four) {
          if (backward) launch_backward(std::integral_constant<int, 4>{});
          else launch(pair_elements_kernel<T, kVec, K, false, 4>);
          return;
        }
      }
      if (backward) launch_backward(std::integral_constant<int, 1>{});
      else launch(pair_elements_kernel<T, kVec, K, false, 1>);
    });
  });
}

// Segments per row of the reduced forward (Note [segment size]): with fewer rows than SMs,
// enough (row, segment) pairs for kSegmentsPerSmFewRows per SM; from sm_count rows on, the
// unrolled kernel (`resident`: its blocks resident at once on the device, else 0) takes the most
// segments a row that still fit one wave of it, the element-wise pair_rows_kernel
// kSegmentsPerSmLight (tvd) or kSegmentsPerSm (jsd, kl_div: the accurate exp / log) per SM. Each
// segment has at least kMinSegmentUnits units.
// Note [segment size]: 16 rows of a 128k vocab would otherwise be 16 blocks. With few rows the
// kernel is latency-bound: its time is the few dependent load rounds of each thread plus the last
// block's sum, so segments are many and short; with many rows the segments' extra sums cost more
// than they spread. H200, bf16, 2026-11-29, every setting in one call (us): 16 per SM with a
// 64-unit floor against the earlier 8 per SM with a 1024-unit floor gave kl_div 16 x 32,000 6.03
// -> 4.52, 16 x 128,256 6.2 -> 5.80; tvd 4.11 -> 3.55 and 4.66 -> 4.50; jsd 8.69 -> 5.77 and 8.58
// -> 7.62; 32 per SM lost at 16 x 128,256 (kl_div 6.22, tvd 5.52): docs/perf/
// gpu-h200-2026-11-29-round26.md. With many rows a second, partial wave of blocks is what costs
// (2026-11-30, docs/perf/gpu-h200-2026-11-30-round29.md; the unrolled kernel holds 4 blocks an SM,
// 528 on an H200): at 1,024 x 32,000 one segment a row (1,024 blocks) against two took kl_div 44.1
// -> 40.4 us, jsd 62.1 -> 58.6; at 256 x 128,256 two segments (512 blocks, one wave) against three
// or five: kl_div 46.6-47.0 -> 39.2, jsd 63.8-64.5 -> 56.9-57.1. tvd's pair_rows_kernel: 4 per SM
// (256 x 128,256: 33.7 us) against 8 (36.3) and 2 (43.7); jsd / kl_div's: 8 per SM (68.2 / 45.4)
// against 4 (86.8 / 55.8). The unrolled kernel (kl_div, jsd) of fewer rows than SMs takes a
// 32-unit floor (one pack a thread of a warp's segment, twice the warps): H200, bf16, 2026-12-02,
// two rounds against the 64-unit floor, us: kl_div 16 x 32,000 4.34 / 4.34 -> 3.98 / 3.98, jsd
// 4.20 / 4.22 -> 4.16 / 4.16; 16 x 128,256 unchanged (the floor does not bind there); tvd's
// kernel lost with it (3.55 -> 3.65), and 16-unit floors lost everywhere (kl_div 4.65):
// docs/perf/gpu-h200-2026-12-02-round38.md. Tuning runs override the constants with
// OPFORGE_CUDA_LOSS_SEGMENTS_PER_SM (1..256, any rows, any kernel) and OPFORGE_CUDA_LOSS_MIN_SEGMENT
// (16..4096).
constexpr int64_t kSegmentsPerSm = 8;
constexpr int64_t kSegmentsPerSmLight = 4;
constexpr int64_t kSegmentsPerSmFewRows = 16;
constexpr int64_t kMinSegmentUnits = 64;
constexpr int64_t kMinSegmentUnitsFewRowsUnrolled = 32;
int64_t splits_for(int64_t rows, int64_t units, int sm_count, int64_t resident, bool light) {
  static const int per_sm = env_choice("OPFORGE_CUDA_LOSS_SEGMENTS_PER_SM", 1, 256);
  static const int min_units = env_choice("OPFORGE_CUDA_LOSS_MIN_SEGMENT", 16, 4096);
  rows = std::max<int64_t>(rows, 1);
  int64_t wanted;
  if (!per_sm && rows >= sm_count && resident > 0) {
    wanted = resident / rows;  // one wave
  } else {
    const int64_t per = per_sm                ? per_sm
                        : rows < sm_count     ? kSegmentsPerSmFewRows
                        : light               ? kSegmentsPerSmLight
                                              : kSegmentsPerSm;
    wanted = (int64_t(sm_count) * per + rows - 1) / rows;
  }
  // The unrolled kernel (resident > 0) of fewer rows than SMs: kMinSegmentUnitsFewRowsUnrolled.
  const int64_t floor = min_units                         ? min_units
                        : rows < sm_count && resident > 0 ? kMinSegmentUnitsFewRowsUnrolled
                                                          : kMinSegmentUnits;
  return std::max<int64_t>(1, std::min(wanted, units / floor));
}

// Blocks of pair_rows_unrolled_kernel<T, K> resident at once on the device (Note [segment size]).
template <class T, Pair K> int64_t unrolled_resident(const CudaDeviceProps& props) {
  static const int fit = [] {
    int n = 0;
    OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, pair_rows_unrolled_kernel<T, K, K == Pair::jsd ? Beta::mixed : Beta::any>, 256, 0));
    return n;
  }();
  return int64_t(fit) * props.sm_count;
}

// kFast: the reduced forward runs pair_rows_unrolled_kernel (vec16 only; Note [unrolled pair
// rows]); reduction none is element-wise and the same for both.
template <bool kVec, bool kFast = false>
void forward(const Context& ctx, const PairCall& c, const TensorView& loss) {
  static_assert(kVec || !kFast, "the unrolled kernel reads 16-byte packs");
  DeviceGuard guard(ctx.device.index);
  if (c.red == PairRed::none) {
    launch_elements<kVec>(ctx, c, false, loss, TensorView{}, nullptr, 1.0);
    return;
  }
  const int64_t rows = c.b->size(0), vocab = c.b->size(1);
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  int64_t splits = 1;
  dispatch_float(c.b->dtype, c.op, [&](auto tag) {
    using T = decltype(tag);
    int64_t resident = 0;
    if constexpr (kFast)
      dispatch_pair(c.kind, [&](auto kind) { resident = unrolled_resident<T, decltype(kind)::value>(props); });
    splits = splits_for(rows, vocab / UnitOf<T, kVec>::width, props.sm_count, resident, c.kind == Pair::tvd);
  });
  const int64_t segments = rows * splits;
  float* sums = static_cast<float*>(cuda_workspace(ctx, std::max<int64_t>(segments, 1) * int64_t(sizeof(float))));
  RowReduce r;
  r.losses = sums, r.losses_per_row = splits, r.rows = rows;
  r.labels = c.labels->defined() ? c.labels->ptr<int64_t>() : nullptr;
  r.labels_stride = c.labels->defined() ? stride0(*c.labels) : 0;
  r.ignore_index = c.ignore_index;
  r.divide = c.red != PairRed::sum, r.divisor_scale = vocab_factor(c.red, vocab);
  r.out = loss.ptr<float>();
  if (rows == 0) {  // the reduction sums nothing (0) and divides by 0 kept rows (NaN), as the reference
    launch_row_reduce(ctx, r, c.op);
    return;
  }
  // One launch: the last block to finish adds the segment sums (Note [last block]).
  unsigned* arrivals = cuda_grid_barrier(ctx);
  dispatch_float(c.b->dtype, c.op, [&](auto tag) {
    using T = decltype(tag);
    PairArgs<T> p = args_of<T>(c);
    p.row_sums = sums;
    const int64_t units = vocab / UnitOf<T, kVec>::width, seg_units = (units + splits - 1) / splits;
    int rt = 32;  // a warp per short segment, up to 256 threads per long one; several per SM
    while (rt < 256 && int64_t(rt) * 8 < seg_units) rt *= 2;
    const int block = 256;  // reduce_rows_in_block<256> in the last block
    const int64_t per_block = block / rt;
    const int64_t max_blocks = int64_t(props.sm_count) * (2048 / block) * 4;
    const int64_t blocks = std::min<int64_t>((segments + per_block - 1) / per_block, max_blocks);
    dispatch_pair(c.kind, [&](auto kind) {
      constexpr Pair K = decltype(kind)::value;
      auto launch_unrolled = [&](auto kernel) {
        launch_programmatic(ctx, c.op, kernel, dim3(unsigned(blocks)), dim3(block), 0, p, rt, splits, seg_units, r,
                            arrivals);
      };
      if constexpr (kFast && K == Pair::jsd) {  // Note [jsd beta at compile time]
        if (c.o.beta_zero)
          launch_unrolled(pair_rows_unrolled_kernel<T, K, Beta::zero>);
        else if (c.o.beta_one)
          launch_unrolled(pair_rows_unrolled_kernel<T, K, Beta::one>);
        else
          launch_unrolled(pair_rows_unrolled_kernel<T, K, Beta::mixed>);
      } else if constexpr (kFast)
        launch_unrolled(pair_rows_unrolled_kernel<T, K, Beta::any>);
      else
        launch_programmatic(ctx, c.op, pair_rows_kernel<T, kVec, K>, dim3(unsigned(blocks)), dim3(block), 0, p, rt,
                            splits, seg_units, r, arrivals);
    });
  });
}

template <bool kVec> void backward(const Context& ctx, const PairCall& c, const TensorView& grad,
                                   const TensorView& dloss) {
  const int64_t rows = c.b->size(0), vocab = c.b->size(1);
  if (rows == 0 || vocab == 0) return;
  DeviceGuard guard(ctx.device.index);
  const float* kept_count = nullptr;
  double divisor = 1.0;
  if (c.red != PairRed::none && c.red != PairRed::sum) {
    divisor = vocab_factor(c.red, vocab);
    if (c.labels->defined()) {
      float* count = static_cast<float*>(cuda_workspace(ctx, sizeof(float)));
      RowReduce r;
      r.rows = rows, r.labels = c.labels->ptr<int64_t>(), r.labels_stride = stride0(*c.labels);
      r.ignore_index = c.ignore_index, r.count_only = true, r.out = count;
      launch_row_reduce(ctx, r, c.op);
      kept_count = count;
    } else {
      divisor *= double(rows);
    }
  }
  launch_elements<kVec>(ctx, c, true, grad, dloss, kept_count, divisor);
}

// ---- predicates -----------------------------------------------------------------------------------

// The [N, V] tensors of a call that the vec16 kernels read or write as packs.
const char* packs_problem(std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (t->defined())
      if (const char* why = pack_rows_problem(*t, t->size(1))) return why;
  return nullptr;
}

const char* reduced_loss_problem(const TensorView& loss, const TensorView& x, PairRed red) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  if (red != PairRed::none && loss.dtype != DType::f32) return "the reduced loss is not f32";
  return nullptr;
}
const char* dloss_problem(const TensorView& dloss, const TensorView& x, PairRed red) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  if (red != PairRed::none && !float_like(dloss.dtype)) return "dloss is not f64, f32, f16 or bf16";
  return nullptr;
}

// eps: a positive eps below f32's range becomes the smallest positive f32, so the clamp still keeps
// log finite where y_true is 0 (as the reference's double eps does).
PairParams params(double eps, double beta) {
  const float eps32 = eps > 0.0 && float(eps) == 0.0f ? std::numeric_limits<float>::denorm_min() : float(eps);
  return PairParams{eps32, float(beta), beta == 0.0, beta == 1.0};
}

}  // namespace
}  // namespace cuda::loss

using namespace cuda::loss;  // NOLINT

namespace {

template <bool kVec, bool kFast = false>
void kl_div_fwd(const Context& ctx, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                bool log_target, std::string_view reduction, double eps) {
  const TensorView none;
  const PairCall c{KlDiv::name, log_target ? Pair::kl_log : Pair::kl, pair_red_of(reduction), &y_pred, &y_true,
                   &none, 0, params(eps, 0)};
  forward<kVec, kFast>(ctx, c, loss);
}
template <bool kVec> void kl_div_bwd(const Context& ctx, const TensorView& dy_pred, const TensorView& dloss,
                                     const TensorView& y_true, bool log_target, std::string_view reduction,
                                     double eps) {
  const TensorView none;
  const PairCall c{KlDivBackward::name, log_target ? Pair::kl_log : Pair::kl, pair_red_of(reduction), &none,
                   &y_true, &none, 0, params(eps, 0)};
  backward<kVec>(ctx, c, dy_pred, dloss);
}
template <bool kVec, bool kFast = false>
void jsd_fwd(const Context& ctx, const TensorView& loss, const TensorView& input, const TensorView& target,
             const TensorView& labels, double beta, int64_t ignore_index) {
  const PairCall c{Jsd::name, Pair::jsd, PairRed::batchmean, &input, &target, &labels, ignore_index, params(0, beta)};
  forward<kVec, kFast>(ctx, c, loss);
}
template <bool kVec> void jsd_bwd(const Context& ctx, const TensorView& dinput, const TensorView& dloss,
                                  const TensorView& input, const TensorView& target, const TensorView& labels,
                                  double beta, int64_t ignore_index) {
  const PairCall c{JsdBackward::name, Pair::jsd, PairRed::batchmean, &input, &target, &labels, ignore_index,
                   params(0, beta)};
  backward<kVec>(ctx, c, dinput, dloss);
}
template <bool kVec> void tvd_fwd(const Context& ctx, const TensorView& loss, const TensorView& p,
                                  const TensorView& q, const TensorView& labels, std::string_view reduction,
                                  int64_t ignore_index) {
  const PairCall c{Tvd::name, Pair::tvd, pair_red_of(reduction), &p, &q, &labels, ignore_index, params(0, 0)};
  forward<kVec>(ctx, c, loss);
}
template <bool kVec> void tvd_bwd(const Context& ctx, const TensorView& dp, const TensorView& dloss,
                                  const TensorView& p, const TensorView& q, const TensorView& labels,
                                  std::string_view reduction, int64_t ignore_index) {
  const PairCall c{TvdBackward::name, Pair::tvd, pair_red_of(reduction), &p, &q, &labels, ignore_index,
                   params(0, 0)};
  backward<kVec>(ctx, c, dp, dloss);
}

}  // namespace

// ---- kl_div ---------------------------------------------------------------------------------------
void kl_div_cuda(const Context& ctx, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                 bool log_target, std::string_view reduction, double eps) {
  kl_div_fwd<false>(ctx, loss, y_pred, y_true, log_target, reduction, eps);
}
void kl_div_cuda_vec16(const Context& ctx, const TensorView& loss, const TensorView& y_pred,
                       const TensorView& y_true, bool log_target, std::string_view reduction, double eps) {
  kl_div_fwd<true>(ctx, loss, y_pred, y_true, log_target, reduction, eps);
}
const char* kl_div_cuda_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView&, bool,
                                   std::string_view reduction, double) {
  return reduced_loss_problem(loss, y_pred, pair_red_of(reduction));
}
const char* kl_div_cuda_vec16_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                                         bool log_target, std::string_view reduction, double eps) {
  if (const char* why = kl_div_cuda_applicable(loss, y_pred, y_true, log_target, reduction, eps)) return why;
  const bool none = pair_red_of(reduction) == PairRed::none;
  return packs_problem({&y_pred, &y_true, none ? &loss : &y_pred});
}

// cuda_vec16_fast: the reduced forward of Note [unrolled pair rows]; reduction none goes to cuda_vec16.
void kl_div_cuda_vec16_fast(const Context& ctx, const TensorView& loss, const TensorView& y_pred,
                            const TensorView& y_true, bool log_target, std::string_view reduction, double eps) {
  kl_div_fwd<true, true>(ctx, loss, y_pred, y_true, log_target, reduction, eps);
}
const char* kl_div_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& y_pred,
                                              const TensorView& y_true, bool log_target, std::string_view reduction,
                                              double eps) {
  if (pair_red_of(reduction) == PairRed::none) return "reduction none is element-wise (cuda_vec16)";
  return kl_div_cuda_vec16_applicable(loss, y_pred, y_true, log_target, reduction, eps);
}

void kl_div_backward_cuda(const Context& ctx, const TensorView& dy_pred, const TensorView& dloss,
                          const TensorView& y_true, bool log_target, std::string_view reduction, double eps) {
  kl_div_bwd<false>(ctx, dy_pred, dloss, y_true, log_target, reduction, eps);
}
void kl_div_backward_cuda_vec16(const Context& ctx, const TensorView& dy_pred, const TensorView& dloss,
                                const TensorView& y_true, bool log_target, std::string_view reduction,
                                double eps) {
  kl_div_bwd<true>(ctx, dy_pred, dloss, y_true, log_target, reduction, eps);
}
const char* kl_div_backward_cuda_applicable(const TensorView&, const TensorView& dloss, const TensorView& y_true,
                                            bool, std::string_view reduction, double) {
  return dloss_problem(dloss, y_true, pair_red_of(reduction));
}
const char* kl_div_backward_cuda_vec16_applicable(const TensorView& dy_pred, const TensorView& dloss,
                                                  const TensorView& y_true, bool log_target,
                                                  std::string_view reduction, double eps) {
  if (const char* why = kl_div_backward_cuda_applicable(dy_pred, dloss, y_true, log_target, reduction, eps))
    return why;
  const bool none = pair_red_of(reduction) == PairRed::none;
  return packs_problem({&dy_pred, &y_true, none ? &dloss : &y_true});
}

// ---- jsd ------------------------------------------------------------------------------------------
void jsd_cuda(const Context& ctx, const TensorView& loss, const TensorView& input, const TensorView& target,
              const TensorView& labels, double beta, int64_t ignore_index) {
  jsd_fwd<false>(ctx, loss, input, target, labels, beta, ignore_index);
}
void jsd_cuda_vec16(const Context& ctx, const TensorView& loss, const TensorView& input, const TensorView& target,
                    const TensorView& labels, double beta, int64_t ignore_index) {
  jsd_fwd<true>(ctx, loss, input, target, labels, beta, ignore_index);
}
const char* jsd_cuda_applicable(const TensorView& loss, const TensorView& input, const TensorView&,
                                const TensorView&, double, int64_t) {
  return reduced_loss_problem(loss, input, PairRed::batchmean);
}
const char* jsd_cuda_vec16_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                      const TensorView& labels, double beta, int64_t ignore_index) {
  if (const char* why = jsd_cuda_applicable(loss, input, target, labels, beta, ignore_index)) return why;
  return packs_problem({&input, &target});
}

void jsd_cuda_vec16_fast(const Context& ctx, const TensorView& loss, const TensorView& input,
                         const TensorView& target, const TensorView& labels, double beta, int64_t ignore_index) {
  jsd_fwd<true, true>(ctx, loss, input, target, labels, beta, ignore_index);
}
const char* jsd_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                           const TensorView& labels, double beta, int64_t ignore_index) {
  return jsd_cuda_vec16_applicable(loss, input, target, labels, beta, ignore_index);
}

void jsd_backward_cuda(const Context& ctx, const TensorView& dinput, const TensorView& dloss,
                       const TensorView& input, const TensorView& target, const TensorView& labels, double beta,
                       int64_t ignore_index) {
  jsd_bwd<false>(ctx, dinput, dloss, input, target, labels, beta, ignore_index);
}
void jsd_backward_cuda_vec16(const Context& ctx, const TensorView& dinput, const TensorView& dloss,
                             const TensorView& input, const TensorView& target, const TensorView& labels,
                             double beta, int64_t ignore_index) {
  jsd_bwd<true>(ctx, dinput, dloss, input, target, labels, beta, ignore_index);
}
const char* jsd_backward_cuda_applicable(const TensorView&, const TensorView& dloss, const TensorView& input,
                                         const TensorView&, const TensorView&, double, int64_t) {
  return dloss_problem(dloss, input, PairRed::batchmean);
}
const char* jsd_backward_cuda_vec16_applicable(const TensorView& dinput, const TensorView& dloss,
                                               const TensorView& input, const TensorView& target,
                                               const TensorView& labels, double beta, int64_t ignore_index) {
  if (const char* why = jsd_backward_cuda_applicable(dinput, dloss, input, target, labels, beta, ignore_index))
    return why;
  return packs_problem({&dinput, &input, &target});
}

// ---- tvd ------------------------------------------------------------------------------------------
void tvd_cuda(const Context& ctx, const TensorView& loss, const TensorView& p, const TensorView& q,
              const TensorView& labels, std::string_view reduction, int64_t ignore_index) {
  tvd_fwd<false>(ctx, loss, p, q, labels, reduction, ignore_index);
}
void tvd_cuda_vec16(const Context& ctx, const TensorView& loss, const TensorView& p, const TensorView& q,
                    const TensorView& labels, std::string_view reduction, int64_t ignore_index) {
  tvd_fwd<true>(ctx, loss, p, q, labels, reduction, ignore_index);
}
const char* tvd_cuda_applicable(const TensorView& loss, const TensorView& p, const TensorView&, const TensorView&,
                                std::string_view reduction, int64_t) {
  return reduced_loss_problem(loss, p, pair_red_of(reduction));
}
const char* tvd_cuda_vec16_applicable(const TensorView& loss, const TensorView& p, const TensorView& q,
                                      const TensorView& labels, std::string_view reduction, int64_t ignore_index) {
  if (const char* why = tvd_cuda_applicable(loss, p, q, labels, reduction, ignore_index)) return why;
  const bool none = pair_red_of(reduction) == PairRed::none;
  return packs_problem({&p, &q, none ? &loss : &p});
}

void tvd_backward_cuda(const Context& ctx, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                       const TensorView& q, const TensorView& labels, std::string_view reduction,
                       int64_t ignore_index) {
  tvd_bwd<false>(ctx, dp, dloss, p, q, labels, reduction, ignore_index);
}
void tvd_backward_cuda_vec16(const Context& ctx, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                             const TensorView& q, const TensorView& labels, std::string_view reduction,
                             int64_t ignore_index) {
  tvd_bwd<true>(ctx, dp, dloss, p, q, labels, reduction, ignore_index);
}
const char* tvd_backward_cuda_applicable(const TensorView&, const TensorView& dloss, const TensorView& p,
                                         const TensorView&, const TensorView&, std::string_view reduction,
                                         int64_t) {
  return dloss_problem(dloss, p, pair_red_of(reduction));
}
const char* tvd_backward_cuda_vec16_applicable(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                                               const TensorView& q, const TensorView& labels,
                                               std::string_view reduction, int64_t ignore_index) {
  if (const char* why = tvd_backward_cuda_applicable(dp, dloss, p, q, labels, reduction, ignore_index)) return why;
  const bool none = pair_red_of(reduction) == PairRed::none;
  return packs_problem({&dp, &p, &q, none ? &dloss : &p});
}

// ---- registration ---------------------------------------------------------------------------------
void register_divergence_cuda(Registry& reg) {
  const char* fwd_vec = "16-byte packs of both inputs, f32 element losses, per-row sums then a fixed-order sum";
  const char* fwd = "any layout: one element per thread-step, per-row sums then a fixed-order sum";
  const char* bwd_vec = "one streaming pass of 16-byte packs, no reduction";
  const char* bwd = "any layout: one streaming pass, no reduction";
  auto add = [&](auto op_tag, auto vec16, auto vec16_ok, auto scalar, auto scalar_ok, bool is_backward) {
    using Op = decltype(op_tag);
    reg.add_kernel<Op>(cuda_kernel_desc("cuda_vec16", 200, is_backward ? bwd_vec : fwd_vec, false), vec16, vec16_ok);
    reg.add_kernel<Op>(cuda_kernel_desc("cuda", 100, is_backward ? bwd : fwd, false), scalar, scalar_ok);
  };
  const char* fwd_fast =
      "reduced forward: 16 elements of both inputs in flight per thread, special-function-unit log for 16-bit "
      "data, per-segment sums then a fixed-order sum";
  reg.add_kernel<KlDiv>(cuda_kernel_desc("cuda_vec16_fast", 300, fwd_fast, false), &kl_div_cuda_vec16_fast,
                        &kl_div_cuda_vec16_fast_applicable);
  reg.add_kernel<Jsd>(cuda_kernel_desc("cuda_vec16_fast", 300, fwd_fast, false), &jsd_cuda_vec16_fast,
                      &jsd_cuda_vec16_fast_applicable);
  add(KlDiv{}, &kl_div_cuda_vec16, &kl_div_cuda_vec16_applicable, &kl_div_cuda, &kl_div_cuda_applicable, false);
  add(KlDivBackward{}, &kl_div_backward_cuda_vec16, &kl_div_backward_cuda_vec16_applicable, &kl_div_backward_cuda,
      &kl_div_backward_cuda_applicable, true);
  add(Jsd{}, &jsd_cuda_vec16, &jsd_cuda_vec16_applicable, &jsd_cuda, &jsd_cuda_applicable, false);
  add(JsdBackward{}, &jsd_backward_cuda_vec16, &jsd_backward_cuda_vec16_applicable, &jsd_backward_cuda,
      &jsd_backward_cuda_applicable, true);
  add(Tvd{}, &tvd_cuda_vec16, &tvd_cuda_vec16_applicable, &tvd_cuda, &tvd_cuda_applicable, false);
  add(TvdBackward{}, &tvd_backward_cuda_vec16, &tvd_backward_cuda_vec16_applicable, &tvd_backward_cuda,
      &tvd_backward_cuda_applicable, true);
}

}  // namespace opforge
